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
50,000), events decoded, beside a bare keyset SELECT of the same rows (no decoding, no stream logic).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.buckets import BucketSize
from pgjournal.model.timeuuid import TimeUUIDGenerator, make_uuid, ms_of_ticks, ticks_of_ms

from .append import EVENT, PAYLOAD, _cpu_threads, _record_cpu, _threads, cpu_ours
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


def _catchup_setup(ctx: Context) -> dict[str, Any]:
    """Load the tag view with binary COPY: rows as the write path makes them, an hour in the past."""
    total = 50_000 if ctx.quick else 1_000_000
    size = BucketSize.HOUR
    gen = TimeUUIDGenerator()
    first = ticks_of_ms(int(time.time() * 1000) - 3_600_000)
    lsb_bytes, lsb = gen.lsb_bytes, gen.lsb
    columns = ("tag_name, timebucket, ts_time, ts_lsb, timestamp, persistence_id, tag_pid_sequence_nr, sequence_nr, "
               "writer_uuid, ser_id, ser_manifest, event")
    types = ["varchar", "int8", "int8", "int8", "uuid", "varchar", "int8", "int8", "varchar", "int4", "varchar",
             "bytea"]
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
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
    ctx.note(f"tag view: {total:,} events of {CATCHUP_PIDS} persistence ids, Hour buckets")
    journal = Journal.open(ctx.dsn, tag_bucket_size="Hour", tag_eventual_consistency_delay=0.1)
    return {"journal": journal, "total": total}


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


def catchup_raw_select(ctx: Context, state: dict[str, Any]) -> float:
    """The same keyset pages (1,000 rows) without decoding or stream logic: the floor of the query."""
    sql = ("SELECT ts_time, ts_lsb, persistence_id, tag_pid_sequence_nr, sequence_nr, ser_id, ser_manifest, event "
           "FROM tag_views WHERE tag_name = %s AND (timebucket, ts_time, ts_lsb) > (%s, %s, %s) "
           "ORDER BY timebucket, ts_time, ts_lsb LIMIT 1000")
    start = time.perf_counter()
    count = 0
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        key = (0, 0, -(2**63))
        while True:
            rows = conn.execute(sql, (CATCHUP_TAG, *key)).fetchall()
            count += len(rows)
            if len(rows) < 1000:
                break
            last = rows[-1]
            key = (BucketSize.HOUR.bucket_of(ms_of_ticks(last[0])), last[0], last[1])
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
        description="current_events_by_tag over 1,000,000 tagged events (quick: 50,000), decoded",
        setup=_catchup_setup, teardown=_teardown,
        contenders={"ours": catchup_ours, "raw_select": catchup_raw_select},
    ),
]

