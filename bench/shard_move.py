"""shard-move: the online move of a slice range (docs/sharding.md, section 6) holding N events (1,000,000; quick:
20,000) from one private embedded server's database to another's, while writers append to every slice and a
by-slices consumer reads the moved range.

* the journal: one database holding 0-1023 (server 1); the move takes 512-1023 to a database on server 2. The
  moved range is pre-filled by binary COPY with N events (N / 100 persistence ids), the rest with N / 10;
* writers: 8 threads on the moved range, 4 on the rest, each cycling over 8 persistence ids of its own (fresh
  ids, 1 event per append after an expected sequence number, one append every 5 ms at most). A moved-range
  writer refused (``ShardLayoutMismatch``) reopens a ``ShardedJournal`` with the new settings, retrying while
  the records disagree, as the move's test writers do: its pause is from its first refusal to its next
  successful append;
* the consumer: ``current_events_by_slices`` of 512-1023 from its offset pass after pass (10 ms apart when a
  pass found nothing), ``check_layout()`` after each pass and, on ``ShardLayoutMismatch``, a last pass on the
  old journal and a reopen with the new settings from the same offset; its lag is append (the writer's
  success) → delivered, per event.

Reported in the JSON's extra: the move's duration and each step's, the moved-range writers' pauses (p50, p99,
max), the unmoved writers' append latency p99 during the move, the consumer's lag (p50, p99, max: during the
move and overall), correctness (every event delivered once and in order per persistence id), the client's and
servers' CPU, the load average; the detail chart is the timeline of the move (``--report``).

Reference: ``whole_range_verify``, the same move with the verify as first built (no check before the seal; after
it every slice's digest over the whole range on both sides, inside the writers' pause), on a journal loaded the
same way in the same run.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from pgjournal import slice_for_persistence_id
from pgjournal.errors import ShardLayoutMismatch
from pgjournal.model.offsets import Offset, TimestampOffset
from pgjournal.settings import Settings
from pgjournal.shards import ShardedJournal, ShardSettings, migrate_all
from pgjournal.shards.move import Mover
from pgjournal.shards.move_plan import MoveStep, differing
from pgjournal.store import shard_guard as guard_sql

from .by_slices import COLUMNS, PAYLOAD, TYPES
from .cpu import server_cpu
from .harness import Context, Scenario
from .servers import database, postmaster, private_servers

ENTITY = "Cart"
MOVED = (512, 1023)
MOVED_WRITERS, OTHER_WRITERS, PIDS_PER_WRITER = 8, 4, 8
PACE = 0.005
OPEN: dict[str, Any] = {"pool_max_size": 2, "notify": False}


def _pids(tag: str, lo: int, hi: int, count: int, start: int = 0) -> list[str]:
    found: list[str] = []
    n = start
    while len(found) < count:
        pid = f"{ENTITY}|{tag}-{n}"
        n += 1
        if lo <= slice_for_persistence_id(pid) <= hi:
            found.append(pid)
    return found


def _load(dsn: str, events: int, lo: int, hi: int, tag: str) -> None:
    """``events`` rows of ``events // 100`` persistence ids in ``lo..hi``, in time order, two hours old."""
    names = _pids(tag, lo, hi, max(10, events // 100))
    slices = [slice_for_persistence_id(p) for p in names]
    seq = [0] * len(names)
    start = datetime.now(UTC) - timedelta(hours=2)
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy(f"COPY event_journal ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(TYPES)
            for n in range(events):
                i = n % len(names)
                seq[i] += 1
                copy.write_row((slices[i], ENTITY, names[i], seq[i], start + timedelta(microseconds=5 * n), "bench",
                                31, "", PAYLOAD))
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) event_journal")


@dataclass
class Setup:
    old: ShardSettings
    new: ShardSettings
    target: str
    postmasters: list[int]
    events: int


def _servers(ctx: Context) -> list[Any]:
    return ctx.shared.get("shard-move servers", lambda: private_servers(2))


def _setup(ctx: Context) -> Setup:
    """A fresh journal for one round (a round moves its range away), loaded; the servers are the run's."""
    servers = _servers(ctx)
    tag = uuid.uuid4().hex[:8]
    source, target = database(servers[0], f"move_{tag}_source"), database(servers[1], f"move_{tag}_target")
    old = ShardSettings.of([source])
    migrate_all(old)
    events = 20_000 if ctx.quick else 1_000_000
    _load(source, events, *MOVED, f"{tag}m")
    _load(source, events // 10, 0, MOVED[0] - 1, f"{tag}o")
    new = ShardSettings.parse(f"0-{MOVED[0] - 1}={source};{MOVED[0]}-{MOVED[1]}={target}")
    if not ctx.notes:
        ctx.note(f"2 private embedded servers (PostgreSQL {servers[0].status().version}); {events:,} events in "
                 f"{MOVED[0]}-{MOVED[1]}, {events // 10:,} in the rest")
    return Setup(old, new, target, [postmaster(s) for s in servers], events)


class Writer(threading.Thread):
    """Appends to its persistence ids until stopped, every append's (end time, latency) kept; a moved-range
    writer reopens with the new settings when refused (its pause: first refusal → next append), or, with
    ``follow``, lists the target as a spare and follows the move without reopening (its pause: its slowest
    append, the one that waited for the switch)."""

    def __init__(self, setup: Setup, pids: list[str], stop: threading.Event, appended: dict[tuple[str, int], float],
                 follow: bool = False):
        super().__init__(daemon=True)
        self.setup, self.pids, self.stop, self.appended, self.follow = setup, pids, stop, appended, follow
        self.written = dict.fromkeys(pids, 0)
        self.latencies: list[tuple[float, float]] = []
        self.pauses: list[float] = []
        self.paused: list[tuple[float, float]] = []
        self.reopens: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            settings = (ShardSettings.of(list(self.setup.old.dsns), spares=[self.setup.target]) if self.follow
                        else self.setup.old)
            journal = ShardedJournal.open(settings, **OPEN)
            k = 0
            while not self.stop.is_set():
                pid = self.pids[k % len(self.pids)]
                k += 1
                refused_at = None
                while True:
                    started = time.monotonic()
                    try:
                        journal.append(pid, ["e"], expected_seq_nr=self.written[pid])
                        break
                    except ShardLayoutMismatch:
                        refused_at = refused_at or started
                        journal = self._reopen(journal)
                done = time.monotonic()
                self.written[pid] += 1
                self.appended[(pid, self.written[pid])] = done
                self.latencies.append((done, done - started))
                if refused_at is not None:
                    self.pauses.append(done - refused_at)
                    self.paused.append((refused_at, done))
                time.sleep(max(0.0, PACE - (time.monotonic() - started)))
            journal.close()
            if self.follow and self.latencies:
                self.pauses.append(max(latency for _, latency in self.latencies))
        except BaseException as exc:
            self.error = exc

    def _reopen(self, journal: ShardedJournal) -> ShardedJournal:
        began = time.monotonic()
        while True:
            try:
                fresh = ShardedJournal.open(self.setup.new, **OPEN)
            except ShardLayoutMismatch:  # the records do not all hold the new layout yet
                time.sleep(0.005)
                continue
            journal.close()
            self.reopens.append(time.monotonic() - began)
            return fresh


class Consumer(threading.Thread):
    """Reads the moved range from ``offset``, pass after pass; on a layout change it drains the old journal and
    reopens with the new settings, from the same offset (as the move's test consumer)."""

    def __init__(self, setup: Setup, offset: Offset, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.setup, self.offset, self.stop = setup, offset, stop
        self.seen: list[tuple[str, int, float]] = []
        self.reopened_at: float | None = None
        self.error: BaseException | None = None

    def _pass(self, journal: ShardedJournal) -> int:
        found = 0
        for envelope in journal.query.current_events_by_slices(ENTITY, *MOVED, self.offset):
            self.seen.append((envelope.persistence_id, envelope.seq_nr, time.monotonic()))
            self.offset = envelope.offset
            found += 1
        return found

    def run(self) -> None:
        try:
            journal = ShardedJournal.open(self.setup.old, **OPEN)
            while True:
                stopping = self.stop.is_set()
                found = self._pass(journal)
                if self.reopened_at is None:
                    try:
                        journal.check_layout()
                    except ShardLayoutMismatch:
                        self._pass(journal)
                        journal.close()
                        journal = _eventually_open(self.setup.new)
                        self.reopened_at = time.monotonic()
                        continue
                if stopping:
                    break
                if not found:
                    time.sleep(0.01)
            journal.close()
        except BaseException as exc:
            self.error = exc


def _eventually_open(settings: ShardSettings) -> ShardedJournal:
    deadline = time.monotonic() + 60
    while True:
        try:
            return ShardedJournal.open(settings, **OPEN)
        except ShardLayoutMismatch:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(value: float) -> float:
    return round(value * 1000, 1)


@dataclass
class Steps:
    started: float = 0.0
    marks: list[tuple[str, float]] = field(default_factory=list)

    #: The verify's parts (its own progress messages): where the time inside the pause goes.
    parts: list[tuple[str, float]] = field(default_factory=list)

    def __call__(self, what: str, _rows: int) -> None:
        if what in {"plan", "copy", "catch up", "check", "seal", "verify", "switch", "clean up"}:
            self.marks.append((what, time.monotonic()))
        elif what.startswith("verify: "):
            self.parts.append((what.removeprefix("verify: "), time.monotonic()))


class WholeRangeVerify(Mover):
    """The reference: the verify as first built, reading the whole range inside the pause. No check before the
    seal (the step records itself and does nothing) and no passes before it; after the seal, one target
    transaction copies the rows stamped since the last mark − ``backtracking_window``, compares every slice's
    digest over the whole range on both sides, copies the slices that differ, compares again."""

    def _check(self, move: Any) -> None:
        target = self._target
        assert target is not None
        with target.conn.transaction():
            target.conn.execute(*self._record(target, move, MoveStep.CHECKED))

    def _pass_since_check(self, move: Any) -> int:
        return 0

    def _verify(self, move: Any) -> None:
        target, source = self._target, self._databases[move.source]
        assert target is not None and target.row is not None and target.row.move_mark is not None
        since = target.row.move_mark - timedelta(seconds=self.settings.backtracking_window)
        with target.conn.transaction():
            copied = sum(self._copy_rows(move, table, *move.moved, since) for table in self._tables(target))
            for table in self._tables(target):
                copied += self._repair(move, table)[0]
                assert not differing(guard_sql.digests(table, *move.moved).all(source.conn),
                                     guard_sql.digests(table, *move.moved).all(target.conn))
            self._wait_for_target_clock(move)
            target.conn.execute(*self._record(target, move, MoveStep.VERIFIED, rows=copied))


def move(name: str, mover: type[Mover] = Mover, *, follow: bool = False) -> Any:
    def measure(ctx: Context, state: Any) -> float:
        return _move(ctx, mover, name, follow)
    return measure


def _move(ctx: Context, mover_class: type[Mover], name: str, follow: bool) -> float:
    """One move under load; the moved-range writers' pause p99 in ms (the extra holds the last round's rest)."""
    setup = _setup(ctx)
    tag = uuid.uuid4().hex[:8]
    load = os.getloadavg()
    moved_pids = _pids(f"{tag}w", *MOVED, MOVED_WRITERS * PIDS_PER_WRITER)
    other_pids = _pids(f"{tag}w", 0, MOVED[0] - 1, OTHER_WRITERS * PIDS_PER_WRITER)
    with psycopg.connect(setup.old.dsns[0]) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        begin = TimestampOffset(row[0])  # the consumer reads what is written from now on
    stop, stop_reading = threading.Event(), threading.Event()
    appended: dict[tuple[str, int], float] = {}
    moved_writers = [Writer(setup, moved_pids[i::MOVED_WRITERS], stop, appended, follow)
                     for i in range(MOVED_WRITERS)]
    others = [Writer(setup, other_pids[i::OTHER_WRITERS], stop, appended) for i in range(OTHER_WRITERS)]
    consumer = Consumer(setup, begin, stop_reading)
    for thread in [*moved_writers, *others, consumer]:
        thread.start()
    time.sleep(1.0)  # the writers and the consumer run before the move starts (the "before" of the timeline)
    steps = Steps()
    cpu_before, client_before = server_cpu(setup.postmasters), time.process_time()
    t0 = time.monotonic()
    with mover_class(setup.old, MOVED, setup.target, Settings.load(), keep=0, progress=steps) as mover:
        mover.run()
        seals = list(mover.seal_seconds)
    t1 = time.monotonic()
    cpu_after, client_after = server_cpu(setup.postmasters), time.process_time()
    time.sleep(1.0)  # and after it
    stop.set()
    for writer in [*moved_writers, *others]:
        writer.join(120)
        assert writer.error is None, repr(writer.error)
    moved_total = {pid: n for w in moved_writers for pid, n in w.written.items()}
    deadline = time.monotonic() + 120
    while sum(1 for pid, _, _ in list(consumer.seen) if pid in moved_total) < sum(moved_total.values()):
        assert consumer.error is None, repr(consumer.error)
        assert time.monotonic() < deadline, "the consumer did not deliver every event of the moved range"
        time.sleep(0.05)
    stop_reading.set()
    consumer.join(120)
    assert consumer.error is None, repr(consumer.error)

    by_pid: dict[str, list[int]] = {}
    lags: list[tuple[float, float]] = []
    for pid, seq_nr, at in consumer.seen:
        by_pid.setdefault(pid, []).append(seq_nr)
        if (pid, seq_nr) in appended:
            lags.append((at, at - appended[(pid, seq_nr)]))
    duplicates = sum(len(seqs) - len(set(seqs)) for seqs in by_pid.values())
    out_of_order = sum(1 for seqs in by_pid.values() if seqs != sorted(seqs))
    missing = sum(max(0, n - len(set(by_pid.get(pid, [])))) for pid, n in moved_total.items())
    with ShardedJournal.open(setup.new, **OPEN) as journal:
        stored = all(journal.highest_seq_nr(pid) == n for w in [*moved_writers, *others]
                     for pid, n in w.written.items())
    pauses = [p for w in moved_writers for p in w.pauses]
    reopens = [r for w in moved_writers for r in w.reopens]
    during = [lat for at, lat in (x for w in others for x in w.latencies) if t0 <= at <= t1]
    lag_during = [lag for at, lag in lags if t0 <= at <= t1 + 5]
    all_lags = [lag for _, lag in lags]
    marks = [*steps.marks, ("done", t1)]
    step_s = {name: round(marks[i + 1][1] - at, 3) for i, (name, at) in enumerate(marks[:-1])}
    seal_end = dict(marks).get("verify", t1)
    switched = dict(marks).get("clean up", t1)
    ctx.extra[name] = {
        "events_in_moved_range": setup.events,
        "load_average_at_start": [round(x, 2) for x in load],
        "move_s": round(t1 - t0, 3),
        "steps_s": step_s,
        "seal_attempts_s": [round(s, 4) for s in seals],
        "verify_parts_s": _parts(dict(marks).get("verify"), steps.parts),
        "inside_pause_s": round(switched - seal_end, 3),
        "moved_writers_pause_ms": {"n": len(pauses), "p50": _ms(_pct(pauses, 0.5)), "p99": _ms(_pct(pauses, 0.99)),
                                   "max": _ms(max(pauses, default=0.0))},
        "moved_writers_reopen_ms": {"p50": _ms(_pct(reopens, 0.5)), "max": _ms(max(reopens, default=0.0))},
        "unmoved_writers_latency_ms": {"n": len(during), "p50": _ms(_pct(during, 0.5)),
                                       "p99": _ms(_pct(during, 0.99)), "max": _ms(max(during, default=0.0))},
        "consumer_lag_ms": {"during_move": {"n": len(lag_during), "p50": _ms(_pct(lag_during, 0.5)),
                                            "p99": _ms(_pct(lag_during, 0.99)),
                                            "max": _ms(max(lag_during, default=0.0))},
                            "overall": {"n": len(all_lags), "p50": _ms(_pct(all_lags, 0.5)),
                                        "p99": _ms(_pct(all_lags, 0.99)), "max": _ms(max(all_lags, default=0.0))}},
        "correctness": {"moved_events_written": sum(moved_total.values()), "delivered": len(consumer.seen),
                        "missing": missing, "duplicated": duplicates, "pids_out_of_order": out_of_order,
                        "every_append_stored": stored, "consumer_reopened": consumer.reopened_at is not None},
        "cpu_s_during_move": {"client": round(client_after - client_before, 2),
                              "servers": {str(i): round(cpu_after[p] - cpu_before.get(p, 0.0), 2)
                                          for i, p in enumerate(setup.postmasters) if p in cpu_after}},
        "timeline": _timeline(t0, moved_writers, others, lags, marks),
    }
    shown = ", ".join(f"{k} {v:.2f}" for k, v in step_s.items())
    ctx.note(f"{name}: move of {setup.events:,} events: {t1 - t0:.1f} s ({shown}); moved writers' pause p50 "
             f"{_ms(_pct(pauses, 0.5))} ms, max {_ms(max(pauses, default=0.0))} ms; "
             f"consumer lag p99 during the move {_ms(_pct(lag_during, 0.99))} ms; missing {missing}, duplicated "
             f"{duplicates}; load average {load[0]:.1f}")
    assert missing == 0 and duplicates == 0 and out_of_order == 0 and stored
    return _ms(_pct(pauses, 0.99))


def _parts(start: float | None, parts: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds each part of the verify took (from the step's start, then from the previous part)."""
    out, last = {}, start
    for name, at in parts:
        if last is not None:
            out[name] = round(at - last, 3)
        last = at
    return out


def _timeline(t0: float, moved: list[Writer], others: list[Writer], lags: list[tuple[float, float]],
              marks: list[tuple[str, float]]) -> dict[str, Any]:
    """Per 100 ms bucket from the move's start: the slowest moved-range and other append, the largest lag; and
    the steps' start times (seconds from the move's start): what the chart draws."""
    buckets: dict[str, dict[int, float]] = {"moved_append_ms": {}, "other_append_ms": {}, "lag_ms": {}}

    def put(series: str, at: float, value: float) -> None:
        key = int((at - t0) * 10)
        buckets[series][key] = max(buckets[series].get(key, 0.0), value * 1000)

    for w in moved:
        for at, lat in w.latencies:
            put("moved_append_ms", at, lat)
    for w in others:
        for at, lat in w.latencies:
            put("other_append_ms", at, lat)
    for at, lag in lags:
        put("lag_ms", at, lag)
    return {"steps": [[name, round(at - t0, 3)] for name, at in marks],
            "pauses": [[round(a - t0, 3), round(b - t0, 3)] for w in moved for a, b in w.paused],
            **{series: [[k / 10, round(v, 1)] for k, v in sorted(found.items())] for series, found in buckets.items()}}


def chart(summaries: list[dict[str, Any]], path: str | Path) -> None:
    """The move's timeline: the slowest appends (moved range, the rest) and the consumer's largest lag per
    100 ms, the steps shaded; log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(summary, name) for summary in summaries for name in ("ours", "whole_range_verify")
            if name in summary["extra"]]
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 4.5 * len(runs)), squeeze=False)
    for (ax,), (summary, name) in zip(axes, runs, strict=True):
        extra = summary["extra"][name]
        line = extra["timeline"]
        steps = line["steps"]
        colors = {"plan": "#eeeeee", "copy": "#dde8f5", "catch up": "#e4f2dc", "check": "#fbf0d5",
                  "seal": "#f6d5d5", "verify": "#f0c0c0", "switch": "#e8a8a8", "clean up": "#eadcf2"}
        for (step, start), (_, end) in itertools.pairwise(steps):
            ax.axvspan(start, end, color=colors.get(step, "#f4f4f4"), alpha=0.8, lw=0)
            ax.text(start, 1.02, step, transform=ax.get_xaxis_transform(), fontsize=7, rotation=30)
        paused = line.get("pauses", [])
        ax.hlines([1000 * (end - start) for start, end in paused], [start for start, _ in paused],
                  [end for _, end in paused], color="darkred", lw=1.5, label="a moved writer's pause (its length)")
        for series, label, style in (("moved_append_ms", "append, moved range (slowest per 100 ms)", "tab:red"),
                                     ("other_append_ms", "append, other slices", "tab:blue"),
                                     ("lag_ms", "consumer lag, moved range (largest per 100 ms)", "tab:green")):
            points = line[series]
            ax.plot([p[0] for p in points], [p[1] for p in points], ".", ms=2.5, color=style, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("seconds from the move's start")
        ax.set_ylabel("ms")
        pause = extra["moved_writers_pause_ms"]
        ax.set_title(f"shard-move, {name}: {extra['events_in_moved_range']:,} events moved in {extra['move_s']:.0f} s; "
                     f"moved writers' pause p50 {pause['p50']:.0f} ms, max {pause['max']:.0f} ms; load "
                     f"{extra['load_average_at_start'][0]:.1f}", fontsize=9, pad=28)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


SCENARIOS = [
    Scenario(
        name="shard-move", metric="pause_ms", lower_is_better=True,
        description="online move of slices 512-1023 holding 1,000,000 events (quick: 20,000) to a database on "
                    "another private server, 8 writers on the moved range and 4 on the rest (an append each 5 ms "
                    "at most), a by-slices consumer of the range; value: the moved-range writers' pause p99 "
                    "(ours: writers listing the target as a spare follow the move, their slowest append; "
                    "reopening_writers: refusal → next append, reopen included); durations, lags and correctness "
                    "in the extra",
        setup=_servers, contenders={"ours": move("ours", follow=True), "reopening_writers": move("reopening_writers"),
                                    "whole_range_verify": move("whole_range_verify", WholeRangeVerify)},
        chart=chart,
    ),
]
