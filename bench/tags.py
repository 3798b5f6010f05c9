"""tags-append and tags-catchup: the Cassandra-compatible tag path.

``tags-append`` (8 writers) and ``tags-append-1`` (1 writer): 1 event per transaction, one entity per
writer, with 1 tag through the default tag path ("ours": a journal opened without ``tag_batch_writer`` on a new
database, so the batched tag writer; the round ends when its tag rows are written: :meth:`TagBatcher.flush` is
inside the measured time) beside the same append untagged, with 3 tags (the default path), with 1 tag through
the in-statement writer (``in_statement``: ``tag_batch_writer=False``, the tag rows and progress in the
append's own statement, on a database of its own), and the physical floor of a tag view (``tag_rows_floor``):
the untagged appends, and a thread that copies their rows into ``tag_views`` every 0.1 s with one bare
``INSERT ... SELECT`` (no progress, watermark, TimeUUIDs or numbering: the least a second copy of each event
costs; its last rows are inside the measured time too). The ``*-cpu`` variants report client + server CPU µs
per append of the same contenders but the 3 tags.
``tags-catchup``: ``current_events_by_tag`` over a tag view loaded beforehand (1,000,000 events; quick:
50,000), events decoded, and a live ``events_by_tag`` catching up from an offset before them (``ours_live``),
beside a bare keyset SELECT of the same rows (no decoding, no stream logic) and the same SELECT that also decodes
each payload with msgspec (``decoded_select``): the stream logic's cost shows between the two. Where a row's
client CPU goes and the server's CPU per row are in the JSON line's ``extra`` (:func:`catchup_cpu_per_row`),
with the load average at the start and at the end of the scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.sql

from pgjournal import Journal
from pgjournal.aio import AsyncJournal
from pgjournal.buckets import BucketSize
from pgjournal.codec.akka_formats import read_json
from pgjournal.model.envelope import Source
from pgjournal.model.offsets import NoOffset, TimeBasedUUID
from pgjournal.model.timeuuid import TimeUUIDGenerator, from_key, make_uuid, ms_of_ticks, ticks_of_ms
from pgjournal.query.by_tag import TagEnvelope, TagStream
from pgjournal.query.gate import Gate
from pgjournal.runtime.steps import MORE, Statement, _SyncFetch
from pgjournal.store import tags as tag_store

from .append import EVENT, PAYLOAD, _cpu_threads, _record_cpu, _threads, cpu_ours
from .by_slices import _server_seconds
from .cpu import backend_cpu
from .cpu import measure as measure_cpu
from .harness import Context, Scenario, scratch_database

WRITERS = 8
#: ``tags-append-1``: rounds per round asked for (bench.harness.Scenario.split).
ONE_WRITER_SPLIT = 5
CATCHUP_TAG = "bench-catchup"
CATCHUP_PIDS = 1000


def _append_setup(ctx: Context) -> dict[str, Any]:
    """The default journal on the scenario's database, the in-statement one on a database of its own (a database
    records one tag writer, see pgjournal.tags.writer_mode)."""
    stack = contextlib.ExitStack()
    in_statement_dsn = stack.enter_context(scratch_database(ctx.server_dsn))
    journal = Journal.open(ctx.dsn, pool_max_size=12)
    ctx.note(f"default tag path: {'batched' if journal.settings.tag_batch_writer else 'in-statement'} writer")
    return {"journal": journal, "stack": stack, "in_statement_dsn": in_statement_dsn,
            "in_statement": Journal.open(in_statement_dsn, pool_max_size=12, tag_batch_writer=False)}


def _teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["journal"].close()
    if "in_statement" in state:
        state["in_statement"].close()
        state["stack"].close()


def append_with(tags: tuple[str, ...], writers: int = WRITERS, total: int = 20_000, *, journal_key: str = "journal"
                ) -> Any:
    """Appends with ``tags`` through ``state[journal_key]`` (the default journal, or ``in_statement``)."""
    def measure(ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state[journal_key]
        n = total // 10 if ctx.quick else total

        def work(_w: int, count: int) -> None:
            pid = f"Bench|{uuid.uuid4().hex}"
            for i in range(count):
                journal.append(pid, [EVENT], expected_seq_nr=i, tags=tags)

        def flushed(w: int, count: int) -> None:
            work(w, count)
            if journal.tag_writer is not None:
                journal.tag_writer.flush()  # the round ends when the tag rows are written

        return n / _threads(writers, n // writers, flushed)

    return measure


# The floor's rows: the journal's events copied as they are (ts_time and tag sequence number: the seq_nr).
_FLOOR_INSERT = """
INSERT INTO tag_views (tag_name, timebucket, ts_time, ts_lsb, timestamp, persistence_id, tag_pid_sequence_nr,
    sequence_nr, writer_uuid, ser_id, ser_manifest, event_manifest, event)
SELECT 'bench-floor', 0, e.seq_nr, 0, '00000000-0000-1000-8000-000000000000'::uuid, e.persistence_id, e.seq_nr,
    e.seq_nr, e.writer, e.event_ser_id, e.event_ser_manifest, '', e.event_payload
FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bigint[]) AS w(pid, slice, after, upto)
CROSS JOIN LATERAL (SELECT * FROM event_journal AS e WHERE e.persistence_id = w.pid AND e.slice = w.slice
    AND e.seq_nr > w.after AND e.seq_nr <= w.upto) AS e"""


class _FloorTagWriter:
    """The floor's background writer: the events appended since its last statement, per persistence id."""

    def __init__(self, dsn: str) -> None:
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._lock = threading.Lock()
        self._appended: dict[str, tuple[int, int]] = {}  # pid -> (slice, highest seq_nr)
        self._written: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-floor-tags")
        self._thread.start()

    def appended(self, pid: str, slice_: int, seq_nr: int) -> None:
        with self._lock:
            self._appended[pid] = (slice_, seq_nr)

    def _write(self) -> None:
        with self._lock:
            work = [(pid, s, self._written.get(pid, 0), upto) for pid, (s, upto) in self._appended.items()
                    if upto > self._written.get(pid, 0)]
        if work:
            self._conn.execute(_FLOOR_INSERT, [list(column) for column in zip(*work, strict=True)], prepare=True)
            with self._lock:
                self._written.update((pid, upto) for pid, _, _, upto in work)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._write()

    def finish(self) -> None:
        """Stop, then write what is left."""
        self._stop.set()
        self._thread.join()
        self._write()

    def close(self) -> None:
        self.finish()
        self._conn.close()

    def append(self, journal: Journal, pid: str, seq_nrs: range) -> None:
        """Untagged appends to ``pid`` after each of ``seq_nrs``, their rows copied by this writer."""
        for i in seq_nrs:
            envelope = journal.append(pid, [EVENT], expected_seq_nr=i)[0]
            self.appended(pid, envelope.slice, envelope.seq_nr)


def tag_rows_floor(writers: int = WRITERS, total: int = 20_000) -> Any:
    def measure(ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        n = total // 10 if ctx.quick else total
        floor = _FloorTagWriter(ctx.dsn)

        try:
            elapsed = _threads(writers, n // writers,
                               lambda _w, count: floor.append(journal, f"Bench|{uuid.uuid4().hex}", range(count)))
        except BaseException:
            floor.close()
            raise
        return n / (elapsed + _timed(floor.close))  # the round ends when its tag rows are written

    return measure


def cpu_floor(writers: int, total: int) -> Any:
    """Client + server CPU µs per event of the floor (untagged appends, their rows copied by the floor's thread)."""
    per_writer = total // writers
    warm = 20

    def measure(ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        floor = _FloorTagWriter(ctx.dsn)

        def prepare(_w: int) -> str:
            pid = f"Bench|{uuid.uuid4().hex}"
            for i in range(warm):
                journal.append(pid, [EVENT], expected_seq_nr=i)
            return pid

        seq_nrs = range(warm, warm + per_writer)
        threads = _cpu_threads(writers, prepare, lambda _w, pid: floor.append(journal, pid, seq_nrs), lambda _s: None)

        def run(start: Callable[[], None], stop: Callable[[], None]) -> None:
            def stopped() -> None:
                floor.finish()  # its last rows are this round's (the connection stays open for the reading)
                stop()

            threads(start, stopped)

        try:
            return _record_cpu(ctx, "tag_rows_floor", measure_cpu(ctx.dsn, per_writer * writers, run))
        finally:
            floor.close()

    return measure


def _timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def cpu_tagged(writers: int, total: int, *, journal_key: str = "journal", dsn_key: str | None = None,
               label: str = "ours") -> Any:
    """Client + server CPU µs per tagged append through ``state[journal_key]`` (on ``state[dsn_key]``, default the
    scenario's database); with the batched tag writer, its thread and its tag view statements included (they are
    written before the second reading)."""
    per_writer = total // writers
    warm = 20

    def measure(ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state[journal_key]

        def flush() -> None:
            if journal.tag_writer is not None:
                journal.tag_writer.flush()

        def prepare(_w: int) -> str:
            pid = f"Bench|{uuid.uuid4().hex}"
            for i in range(warm):
                journal.append(pid, [EVENT], expected_seq_nr=i, tags=("bench",))
            return pid

        def work(_w: int, pid: str) -> None:
            for i in range(warm, warm + per_writer):
                journal.append(pid, [EVENT], expected_seq_nr=i, tags=("bench",))

        threads = _cpu_threads(writers, prepare, work, lambda _s: None)

        def run(start: Callable[[], None], stop: Callable[[], None]) -> None:
            def started() -> None:
                flush()  # the warm-up's rows are not this round's
                start()

            def stopped() -> None:
                flush()
                stop()

            threads(started, stopped)

        dsn = state[dsn_key] if dsn_key else ctx.dsn
        return _record_cpu(ctx, label, measure_cpu(dsn, per_writer * writers, run))

    return measure


def load_tag_view(dsn: str, total: int) -> int:
    """Load the tag view with binary COPY: ``total`` rows as the write path makes them, of
    :data:`CATCHUP_PIDS` persistence ids, an hour in the past, in Hour buckets; the first row's ticks."""
    size = BucketSize.HOUR
    gen = TimeUUIDGenerator()
    first = ticks_of_ms(int(time.time() * 1000) - 3_600_000)
    lsb_bytes, lsb = gen.lsb_bytes, gen.lsb
    columns = ("tag_name, timebucket, ts_time, ts_lsb, timestamp, persistence_id, tag_pid_sequence_nr, sequence_nr, "
               "writer_uuid, ser_id, ser_manifest, event")
    types = ["varchar", "int8", "int8", "int8", "uuid", "varchar", "int8", "int8", "varchar", "int4", "varchar",
             "bytea"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO tag_settings (name, value) VALUES ('bucket_size', %s)", (size.label,))
        with conn.cursor().copy(f"COPY tag_views ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(types)
            for i in range(total):
                ticks = first + i * 20  # 2 µs apart
                seq = i // CATCHUP_PIDS + 1
                bucket = size.bucket_of(ms_of_ticks(ticks))
                copy.write_row((CATCHUP_TAG, bucket, ticks, lsb, make_uuid(ticks, lsb_bytes),
                                f"Bench|{i % CATCHUP_PIDS}", seq, seq, "bench", 31, "", PAYLOAD))
        conn.execute("VACUUM ANALYZE tag_views")
    return first


def _catchup_setup(ctx: Context) -> dict[str, Any]:
    total = 50_000 if ctx.quick else 1_000_000
    first = load_tag_view(ctx.dsn, total)
    ctx.note(f"tag view: {total:,} events of {CATCHUP_PIDS} persistence ids, Hour buckets")
    ctx.extra["load_average_start"] = list(os.getloadavg())
    journal = Journal.open(ctx.dsn, tag_bucket_size="Hour", tag_eventual_consistency_delay=0.1)
    # A second before the first row: a live query resuming from an old offset reads them all.
    state = {"journal": journal, "total": total,
             "old_offset": TimeBasedUUID(from_key(first - 10_000_000, -(2**63)))}
    _explain_page(ctx, journal)
    ctx.extra.update(catchup_cpu_per_row(ctx.dsn, journal, total))
    return state


def _catchup_teardown(ctx: Context, state: dict[str, Any]) -> None:
    ctx.extra["load_average_end"] = list(os.getloadavg())
    _teardown(ctx, state)


def _explain_page(ctx: Context, journal: Journal) -> None:
    """The plan of the stream's first page: as an unnamed statement (a custom plan) and prepared with a generic
    plan (a page read whole is prepared: after a few runs the server may keep a generic plan)."""
    stream = TagStream(journal, CATCHUP_TAG, NoOffset, live=False)
    sql, params = tag_store.page(CATCHUP_TAG, stream._bound(stream._pos), 2**62, 2**62, journal.settings.buffer_size)
    numbered = sql
    for i in range(1, len(params) + 1):
        numbered = numbered.replace("%s", f"${i}", 1)
    explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
    with journal.connection() as conn:
        custom = conn.execute(explain + sql, params).fetchone()[0][0]
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE bench_tag_page (text, bigint, bigint, bigint, bigint, bigint, int) AS " + numbered)
        values = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(v) for v in params)
        generic = conn.execute(psycopg.sql.SQL(explain + "EXECUTE bench_tag_page ({})").format(values)
                               ).fetchone()[0][0]
        conn.execute("DEALLOCATE bench_tag_page")
        conn.execute("RESET plan_cache_mode")
    for mode, plan in (("custom", custom), ("generic", generic)):
        node = plan["Plan"]
        ctx.note(f"tag page of {journal.settings.buffer_size} ({mode} plan): {plan['Execution Time']:.2f} ms, shared "
                 f"buffers hit+read {node.get('Shared Hit Blocks', 0) + node.get('Shared Read Blocks', 0)}, plan "
                 f"{_plan_shape(node)}")
        ctx.extra[f"page_plan_{mode}"] = {"execution_ms": plan["Execution Time"], "shape": _plan_shape(node),
                                          "index_cond": _first(node, "Index Cond")}


def _plan_shape(node: dict[str, Any]) -> str:
    name = node["Node Type"] + (f" using {node['Index Name']}" if "Index Name" in node else "")
    kids = node.get("Plans", [])
    return name if not kids else f"{name} → {_plan_shape(kids[0])}"


def _first(node: dict[str, Any], key: str) -> Any:
    if key in node:
        return node[key]
    for kid in node.get("Plans", []):
        found = _first(kid, key)
        if found is not None:
            return found
    return None


def catchup_cpu_per_row(dsn: str, journal: Journal, expected: int, passes: int = 3) -> dict[str, Any]:
    """Where a tag catch-up row's CPU goes, in µs per row, as ``bench.by_slices.cpu_per_row`` splits a slice
    catch-up (each figure the best of ``passes``; client: ``time.process_time()``, server: the backends'
    ``/proc`` CPU):

    * ``read``: the whole ``current_events_by_tag``, iterated as a consumer does (nothing instrumented);
    * ``fetch``, ``page_loop`` and ``envelopes``: the same query with its steps run by a driver that times them:
      psycopg's execute and fetch (rows built, every chunk of a streamed page), the steps' own code (the gate,
      positions, and whatever of decoding the step does itself) and taking a step's envelopes (what is made as
      they are taken);
    * replayed alone over that pass's rows: ``gate`` (:meth:`Gate.take_leading` per page: the per-(tag, pid)
      sequence checks; gap detection is the rows it does not take), ``position`` (the TimeUUID position kept
      per row), ``offset_uuid`` (an envelope's ``offset`` made into a TimeBasedUUID, what a consumer that stores
      every offset pays; the stream makes it only when asked), ``decode`` (the payload as the stream decodes it)
      and ``read_json`` (msgspec alone), ``envelope`` (the envelopes, their events given);
    * ``select_*`` and ``decoded_select_*``: the references, the bare keyset SELECT and the one that decodes.
    """
    pt = time.process_time
    read = server = raw = raw_server = dec = dec_server = float("inf")
    for _ in range(passes):
        s0, c0 = backend_cpu(dsn), pt()
        rows = sum(1 for _ in journal.query.current_events_by_tag(CATCHUP_TAG))
        c1, s1 = pt(), backend_cpu(dsn)
        assert rows == expected, (rows, expected)
        read, server = min(read, c1 - c0), min(server, _server_seconds(s0, s1))
        for decode in (False, True):
            with psycopg.connect(dsn, autocommit=True) as conn:
                s0, c0 = backend_cpu(dsn), pt()
                assert _keyset_select(conn, decode) == expected
                c1, s1 = pt(), backend_cpu(dsn)
            if decode:
                dec, dec_server = min(dec, c1 - c0), min(dec_server, _server_seconds(s0, s1))
            else:
                raw, raw_server = min(raw, c1 - c0), min(raw_server, _server_seconds(s0, s1))
    split = min((_timed_tag_pass(journal, expected) for _ in range(passes)), key=lambda parts: sum(parts.values()))
    per_row = {"read": read, **split}
    us = 1e6 / expected
    return {"client_cpu_us_per_row": {k: round(v * us, 3) for k, v in per_row.items()},
            "server_cpu_us_per_row": round(server * us, 3),
            "select_client_cpu_us_per_row": round(raw * us, 3),
            "select_server_cpu_us_per_row": round(raw_server * us, 3),
            "decoded_select_client_cpu_us_per_row": round(dec * us, 3),
            "decoded_select_server_cpu_us_per_row": round(dec_server * us, 3)}


def _timed_tag_pass(journal: Journal, expected: int) -> dict[str, float]:
    """CPU seconds of one current tag query's parts (see :func:`catchup_cpu_per_row`)."""
    pt = time.process_time
    stream = TagStream(journal, CATCHUP_TAG, NoOffset, live=False)
    fetch = code = envelopes = 0.0
    pages: list[list[tuple[Any, ...]]] = []
    taken = 0
    for step in stream.current_steps():
        with journal.connection() as conn:
            fetcher = _SyncFetch(conn)
            c0 = pt()
            request = next(step)
            code += pt() - c0
            in_page = False
            while True:
                c0 = pt()
                answer = fetcher.answer(request)
                fetch += pt() - c0
                if isinstance(request, Statement):
                    in_page = request.sql is tag_store.PAGE
                    if in_page:
                        pages.append([])
                if in_page and (request is MORE or isinstance(request, Statement)):
                    pages[-1].extend(answer)
                c0 = pt()
                try:
                    request = step.send(answer)
                except StopIteration as done:
                    code += pt() - c0
                    items = done.value
                    break
                code += pt() - c0
            fetcher.close_stream()
        c0 = pt()
        for _ in items:
            taken += 1
        envelopes += pt() - c0
    assert taken == expected, (taken, expected)
    rows = [row for page in pages for row in page]
    gate: Gate[None] = Gate()
    c0 = pt()
    for page in pages:
        assert gate.take_leading(page, None) == len(page)
    gate_cpu = pt() - c0
    c0 = pt()
    for row in rows:
        _ = (row[0], row[1])
    position = pt() - c0
    c0 = pt()
    for row in rows:
        TimeBasedUUID(from_key(row[0], row[1]))
    offset_uuid = pt() - c0
    deserialize = journal.serializers.deserialize
    c0 = pt()
    for row in rows:
        deserialize(row[5], row[6], row[7], persistence_id=row[2], seq_nr=row[4])
    decode = pt() - c0
    c0 = pt()
    for row in rows:
        read_json(row[7])
    json_only = pt() - c0
    c0 = pt()
    for row in rows:
        TagEnvelope(CATCHUP_TAG, row[2], row[4], row[3], row[0], row[1], (row[0], row[1]), None, None, row[11],
                    Source.QUERY)
    envelope = pt() - c0
    return {"fetch": fetch, "page_loop": code, "envelopes": envelopes, "gate": gate_cpu, "position": position,
            "offset_uuid": offset_uuid,
            "decode": decode, "read_json": json_only, "envelope": envelope}


def catchup_ours(_ctx: Context, state: dict[str, Any]) -> float:
    journal: Journal = state["journal"]
    start = time.perf_counter()
    count = 0
    for env in journal.query.current_events_by_tag(CATCHUP_TAG):
        count += 1
        _ = env.event
    elapsed = time.perf_counter() - start
    assert count == state["total"], f"read {count} of {state['total']} events"
    return count / elapsed


def catchup_live(_ctx: Context, state: dict[str, Any]) -> float:
    """A live ``events_by_tag`` resuming from an offset before every row: its catch-up until it has them all."""
    journal: Journal = state["journal"]
    total = state["total"]
    start = time.perf_counter()
    count = 0
    with journal.query.events_by_tag(CATCHUP_TAG, state["old_offset"]) as live:
        for env in live:
            count += 1
            _ = env.event
            if count == total:
                break
    return count / (time.perf_counter() - start)


def catchup_async(ctx: Context, state: dict[str, Any]) -> float:
    """``current_events_by_tag`` on the asyncio face (its own journal, opened and closed outside the timing)."""
    return asyncio.run(_async_catchup(ctx.dsn, state, live=False))


def catchup_async_live(ctx: Context, state: dict[str, Any]) -> float:
    """The live catch-up of :func:`catchup_live` on the asyncio face."""
    return asyncio.run(_async_catchup(ctx.dsn, state, live=True))


async def _async_catchup(dsn: str, state: dict[str, Any], *, live: bool) -> float:
    total = state["total"]
    async with await AsyncJournal.open(dsn, tag_bucket_size="Hour", tag_eventual_consistency_delay=0.1) as journal:
        count = 0
        start = time.perf_counter()
        if live:
            async with await journal.query.events_by_tag(CATCHUP_TAG, state["old_offset"]) as stream:
                async for env in stream:
                    count += 1
                    _ = env.event
                    if count == total:
                        break
        else:
            async for env in journal.query.current_events_by_tag(CATCHUP_TAG):
                count += 1
                _ = env.event
        elapsed = time.perf_counter() - start
    assert count == total, f"read {count} of {total} events"
    return count / elapsed


_KEYSET = ("SELECT ts_time, ts_lsb, persistence_id, tag_pid_sequence_nr, sequence_nr, ser_id, ser_manifest, event "
           "FROM tag_views WHERE tag_name = %s AND (timebucket, ts_time, ts_lsb) > (%s, %s, %s) "
           "ORDER BY timebucket, ts_time, ts_lsb LIMIT 1000")


def _keyset_select(conn: psycopg.Connection, decode: bool) -> int:
    """Rows read by the keyset pages (1,000 rows) of the tag, each payload decoded by msgspec when ``decode``."""
    count = 0
    key = (0, 0, -(2**63))
    while True:
        rows = conn.execute(_KEYSET, (CATCHUP_TAG, *key)).fetchall()
        count += len(rows)
        if decode:
            for row in rows:
                read_json(row[7])
        if len(rows) < 1000:
            return count
        last = rows[-1]
        key = (BucketSize.HOUR.bucket_of(ms_of_ticks(last[0])), last[0], last[1])


def catchup_raw_select(ctx: Context, state: dict[str, Any]) -> float:
    """The same keyset pages (1,000 rows) without decoding or stream logic: the floor of the query."""
    start = time.perf_counter()
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        count = _keyset_select(conn, False)
    assert count == state["total"]
    return count / (time.perf_counter() - start)


def catchup_decoded_select(ctx: Context, state: dict[str, Any]) -> float:
    """The keyset pages with each payload decoded (msgspec), no stream logic: the floor of a decoded read."""
    start = time.perf_counter()
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        count = _keyset_select(conn, True)
    assert count == state["total"]
    return count / (time.perf_counter() - start)


SCENARIOS = [
    Scenario(
        name="tags-append", metric="events_per_s",
        description=f"20,000 events (quick: 2,000), 1 per transaction, {WRITERS} writers, with 1 tag (ours: the "
                    "default tag path), untagged, with 3 tags, and with 1 tag in-statement",
        setup=_append_setup, teardown=_teardown,
        contenders={
            "ours": append_with(("bench",)),
            "untagged": append_with(()),
            "3_tags": append_with(("bench", "bench-b", "bench-c")),
            "in_statement": append_with(("bench",), journal_key="in_statement"),
            "tag_rows_floor": tag_rows_floor(),
        },
    ),
    Scenario(
        name="tags-append-1", metric="events_per_s",
        description=f"1,500 events per round (quick: 150), {ONE_WRITER_SPLIT} rounds per --rounds in a rotating "
                    "order, 1 per transaction, 1 writer (the commit flush dominates), with 1 tag (ours: the default "
                    "tag path), untagged, with 3 tags, and with 1 tag in-statement",
        setup=_append_setup, teardown=_teardown,
        contenders={
            "ours": append_with(("bench",), 1, 1_500),
            "untagged": append_with((), 1, 1_500),
            "3_tags": append_with(("bench", "bench-b", "bench-c"), 1, 1_500),
            "in_statement": append_with(("bench",), 1, 1_500, journal_key="in_statement"),
            "tag_rows_floor": tag_rows_floor(1, 1_500),
        },
        # One writer's rate is its latency: a second of load from other work moves a round by half; short
        # rounds, many, in a rotating order (see Scenario.split).
        split=ONE_WRITER_SPLIT,
    ),
    *[Scenario(
        name=name, metric="cpu_us_per_event", lower_is_better=True,
        description=f"client + server CPU µs per event (split in extra), {total:,} events (quick: a tenth), 1 per "
                    f"transaction, {writers} writer(s), with 1 tag (ours: the default tag path) beside untagged and "
                    "the in-statement writer",
        setup=_append_setup, teardown=_teardown,
        contenders={
            "ours": lambda ctx, state, w=writers, t=total: cpu_tagged(w, t // 10 if ctx.quick else t)(ctx, state),
            "untagged": lambda ctx, state, w=writers, t=total: cpu_ours(w, t // 10 if ctx.quick else t,
                                                                         label="untagged")(ctx, state),
            "in_statement": lambda ctx, state, w=writers, t=total: cpu_tagged(
                w, t // 10 if ctx.quick else t, journal_key="in_statement", dsn_key="in_statement_dsn",
                label="in_statement")(ctx, state),
            "tag_rows_floor": lambda ctx, state, w=writers, t=total: cpu_floor(w, t // 10 if ctx.quick else t)(
                ctx, state),
        },
    ) for name, writers, total in (("tags-append-cpu", WRITERS, 8_000), ("tags-append-cpu-1", 1, 3_000))],
    Scenario(
        name="tags-catchup", metric="events_per_s",
        description="current_events_by_tag over 1,000,000 tagged events (quick: 50,000), decoded; a live "
                    "events_by_tag catching up from an older offset",
        setup=_catchup_setup, teardown=_catchup_teardown,
        contenders={"ours": catchup_ours, "ours_live": catchup_live, "ours_async": catchup_async,
                    "ours_async_live": catchup_async_live, "raw_select": catchup_raw_select,
                    "decoded_select": catchup_decoded_select},
    ),
]

