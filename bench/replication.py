"""``replication-throughput``: a location catching up with a peer's backlog, events/s, beside the local reference.

* **ours**: a :class:`~pgjournal.replication.Replicator` (one stream, every slice) copying the peer's 20,000
  events (quick: 2,000; 100 entities of ``Counter``, written at the peer ``us``) into a fresh location ``eu``:
  each event read by slices, its version vector merged, appended to ``eu``'s replica with its metadata, its
  "seen" record and the stream's offsets in the same transaction;
* **local_reference**: the same events read by a by-slices catch-up of the peer's journal and appended, one
  batch per persistence id, into a fresh database: what moving them costs without replication's rules.

Both databases are on the same server, with no WAN delay.

``replication-lag``: the lag from a write at the peer to its arrival in the local replica, at 1,000 events/s, the
peer reached through the tests' fault proxy (``tests/support/faultproxy.py``) with 10 ms each way (a 20 ms round
trip):

* **ours**: a Replicator; the lag of an event is the local row's ``db_timestamp`` minus the peer row's (one
  server, one clock). Each round then cuts the peer off for 30 s (quick: 3 s) while the writers go on, heals the
  link, and records the lag during the partition and the time from the heal until the last event written during
  it has arrived (the JSON line's ``extra``);
* **by_slices_live**: a live ``events_by_slices`` of the peer through the same proxy, its lag the time an event is
  delivered minus its ``db_timestamp``: what reading the peer over that link costs, before any write.

Value: the lag's p99 while healthy, ms.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.model.offsets import NoOffset, TimestampOffset
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Replicator

from .harness import Context, Scenario, scratch_database

TYPE = "Counter"
ENTITIES = 100
SETTINGS = {"refresh_interval": 0.05, "behind_current_time": 0.05}


def _setup(ctx: Context) -> dict[str, Any]:
    total = 2_000 if ctx.quick else 20_000
    peer = Journal.open(ctx.dsn, **SETTINGS)
    per = total // ENTITIES
    for e in range(ENTITIES):
        peer.append(f"{TYPE}|e{e}|us", [{"n": n, "pad": "x" * 64} for n in range(per)])
    ctx.note(f"peer: {total:,} events of {ENTITIES} entities")
    return {"peer": peer, "total": per * ENTITIES}


def _teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["peer"].close()


def _count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM event_journal WHERE persistence_id LIKE %s",
                           (f"{TYPE}|%|eu",)).fetchone()
    return int(row[0]) if row else 0


def replicated(ctx: Context, state: dict[str, Any]) -> float:
    total = state["total"]
    with scratch_database(ctx.server_dsn or ctx.dsn) as dsn, Journal.open(dsn, **SETTINGS) as local:
        stream = Replicator(local, "eu", state["peer"], "us", TYPE, max_count=500,
                            settings=ProjectionSettings(restart_backoff=0.2))
        start = time.perf_counter()
        runner = stream.run_range()
        try:
            # The stream's own count (no query: a poll of the database every few ms would take a share of the
            # server's CPU from the stream it times); the events' presence is checked once, at the end.
            while stream.stats.appended < total:
                if runner.failed is not None:
                    raise RuntimeError(f"the stream failed: {runner.failed}")
                time.sleep(0.002)
            while _count(dsn) < total:  # its last batch counted before its commit
                time.sleep(0.002)
            elapsed = time.perf_counter() - start
        finally:
            runner.stop()
            runner.join(30)
    return total / elapsed


def local_reference(ctx: Context, state: dict[str, Any]) -> float:
    total = state["total"]
    peer: Journal = state["peer"]
    with scratch_database(ctx.server_dsn or ctx.dsn) as dsn, Journal.open(dsn, **SETTINGS) as local:
        start = time.perf_counter()
        batches: dict[str, list[Any]] = {}
        for env in peer.query.current_events_by_slices(TYPE, 0, 1023, NoOffset):
            batches.setdefault(env.persistence_id.replace("|us", "|eu"), []).append(env.event)
        for pid, events in batches.items():
            local.append(pid, events)
        elapsed = time.perf_counter() - start
        assert _count(dsn) == total
    return total / elapsed


# -- replication-lag ------------------------------------------------------------------------------------

RATE = 1_000
ROUND_TRIP = 0.020
WRITERS = 4


def _fault_proxy() -> Any:
    """The tests' fault proxy, loaded from its file: one proxy for the tests and the bench."""
    path = Path(__file__).resolve().parent.parent / "tests" / "support" / "faultproxy.py"
    spec = importlib.util.spec_from_file_location("pgjournal_bench_faultproxy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _lag_setup(ctx: Context) -> dict[str, Any]:
    proxy_module = _fault_proxy()
    params = psycopg.conninfo.conninfo_to_dict(ctx.dsn)
    proxy = proxy_module.FaultProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    proxy.delay(ROUND_TRIP / 2, ROUND_TRIP / 2)
    ctx.note(f"{RATE:,} events/s by {WRITERS} writers at the peer; the peer read through a proxy adding "
             f"{ROUND_TRIP * 1000:.0f} ms of round trip")
    ctx.extra["load_average_start"] = list(os.getloadavg())
    return {"proxy": proxy}


def _lag_teardown(ctx: Context, state: dict[str, Any]) -> None:
    ctx.extra["load_average_end"] = list(os.getloadavg())
    state["proxy"].close()


@contextmanager
def _peer(ctx: Context, state: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A fresh peer database: its writers' journal (direct) and the same journal reached through the proxy."""
    with (scratch_database(ctx.server_dsn or ctx.dsn) as dsn,
          Journal.open(dsn, **SETTINGS, pool_max_size=WRITERS + 1) as writer,
          Journal.open(state["proxy"].dsn(dsn), **SETTINGS) as remote):
        yield {"proxy": state["proxy"], "writer": writer, "remote": remote, "next": 0, "dsn": dsn, "keys": {}}


def _write(state: dict[str, Any], seconds: float) -> tuple[int, int]:
    """Events at :data:`RATE` per second for ``seconds`` at the peer, the n-th (unique in the round) of entity
    ``e{n % ENTITIES}`` (one writer per entity), its (entity, sequence number) in ``state["keys"]``; the first n
    and the last + 1."""
    journal: Journal = state["writer"]
    first = state["next"]
    count = int(RATE * seconds)
    state["next"] = first + count
    start = time.monotonic()
    keys = state["keys"]

    def one(k: int) -> None:
        for i in range(k, count, WRITERS):
            pause = start + i / RATE - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            n = first + i
            written = journal.append(f"{TYPE}|e{n % ENTITIES}|us", [{"w": n}])
            keys[n] = (f"e{n % ENTITIES}", written[0].seq_nr)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return first, first + count


def _stamps(dsn: str, replica: str) -> dict[tuple[str, int], float]:
    """(entity, sequence number) -> db_timestamp (epoch seconds) of the events of ``replica``'s persistence ids
    (a replica of one origin holds its events at the origin's sequence numbers)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT split_part(persistence_id, '|', 2), seq_nr, extract(epoch FROM db_timestamp) "
                            "FROM event_journal WHERE persistence_id LIKE %s", (f"{TYPE}|%|{replica}",)).fetchall()
    return {(entity, seq): float(at) for entity, seq, at in rows}


def _percentiles(lags: list[float]) -> dict[str, float]:
    ordered = sorted(lags)
    at = lambda q: 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(at(0.50), 1), "p99": round(at(0.99), 1), "max": round(1000 * ordered[-1], 1),
            "mean": round(1000 * statistics.fmean(ordered), 1), "events": len(ordered)}


@contextmanager
def _replicating(ctx: Context, state: dict[str, Any]) -> Iterator[str]:
    """A fresh location ``eu`` replicating from the peer through the proxy, running."""
    with scratch_database(ctx.server_dsn or ctx.dsn) as dsn, Journal.open(dsn, **SETTINGS) as local:
        stream = Replicator(local, "eu", state["remote"], "us", TYPE, max_count=500,
                            settings=ProjectionSettings(restart_backoff=0.2))
        runner = stream.run_range()
        try:
            yield dsn
        finally:
            runner.stop()
            runner.join(30)


def _arrived(state: dict[str, Any], local: str, wanted: range, deadline: float) -> dict[int, float]:
    """n -> the local replica's db_timestamp of the n-th event written, once every event of ``wanted`` is there (or
    the deadline passed)."""
    keys = state["keys"]
    while True:
        stamps = _stamps(local, "eu")
        if all(keys[n] in stamps for n in wanted) or time.monotonic() > deadline:
            return {n: stamps[keys[n]] for n in wanted if keys[n] in stamps}
        time.sleep(0.05)


def lag_ours(ctx: Context, shared: dict[str, Any]) -> float:
    healthy_s, partition_s, after_s = (3.0, 3.0, 2.0) if ctx.quick else (20.0, 30.0, 10.0)
    proxy = shared["proxy"]
    with _peer(ctx, shared) as state, _replicating(ctx, state) as local:
        _, first = _write(state, 0.2)  # warm up: the stream's first polls, the pools' connections
        _arrived(state, local, range(first), time.monotonic() + 60)
        _, cut = _write(state, healthy_s)
        _arrived(state, local, range(cut), time.monotonic() + 60)  # the healthy lag is measured without the cut
        proxy.refuse(True)
        proxy.cut()
        _, healed_at = _write(state, partition_s)
        healed = time.time()
        proxy.refuse(False)
        _, end = _write(state, after_s)
        stamps = _arrived(state, local, range(end), time.monotonic() + 120)
        at_peer = _stamps(state["dsn"], "us")
        origin = {n: at_peer[key] for n, key in state["keys"].items()}
    missing = [w for w in range(end) if w not in stamps]
    if missing:
        raise RuntimeError(f"{len(missing)} events did not arrive, first {missing[:5]}")
    lags = {w: stamps[w] - origin[w] for w in range(end)}
    healthy = _percentiles([lags[w] for w in range(first, cut)])
    caught_up = max(stamps[w] for w in range(cut, healed_at)) - healed
    ctx.extra.setdefault("ours", []).append({
        "healthy_lag_ms": healthy, "partition_s": partition_s,
        "lag_during_partition_ms": _percentiles([lags[w] for w in range(cut, healed_at)]),
        "catch_up_after_heal_s": round(caught_up, 2),
        # Until the last event whose lag was more than twice the healthy p99 had arrived (the writers went on).
        "back_to_healthy_after_heal_s": round(max(stamps[w] for w in range(cut, end)
                                                  if lags[w] > 2 * healthy["p99"] / 1000) - healed, 2)})
    return healthy["p99"]


def lag_by_slices_live(ctx: Context, shared: dict[str, Any]) -> float:
    with _peer(ctx, shared) as state:
        return _by_slices_lag(ctx, state)


def _by_slices_lag(ctx: Context, state: dict[str, Any]) -> float:
    healthy_s = 3.0 if ctx.quick else 20.0
    remote: Journal = state["remote"]
    delivered: dict[tuple[str, int], float] = {}

    def read(live: Any) -> None:
        for env in live:
            delivered[(env.persistence_id.split("|")[1], env.seq_nr)] = time.time() - env.db_timestamp.timestamp()

    with remote.query.events_by_slices(TYPE, 0, 1023, TimestampOffset(datetime.now(UTC))) as live:
        reading = threading.Thread(target=read, args=(live,))
        reading.start()
        _write(state, 0.2)
        first, end = _write(state, healthy_s)
        keys = state["keys"]
        deadline = time.monotonic() + 60
        while not all(keys[n] in delivered for n in range(first, end)) and time.monotonic() < deadline:
            time.sleep(0.05)
        live.close()
        reading.join(30)
    figures = _percentiles([delivered[keys[n]] for n in range(first, end) if keys[n] in delivered])
    ctx.extra.setdefault("by_slices_live", []).append({"lag_ms": figures})
    return figures["p99"]


def lag_chart(summaries: list[dict[str, Any]], path: str | Path) -> None:
    """Per round, the lag p50 and p99 of ours healthy, of the by-slices read of the peer, and of ours during the
    partition (log scale), with the rounds' catch-up times after the heal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [summary["extra"] for summary in summaries if "ours" in summary.get("extra", {})]
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
    for ax, extra in zip(axes[0], runs, strict=True):
        rounds = extra["ours"]
        reads = extra.get("by_slices_live", [])
        groups = [("by-slices read\nover the link", [r["lag_ms"] for r in reads]),
                  ("replicated,\nhealthy", [r["healthy_lag_ms"] for r in rounds]),
                  ("replicated, during\nthe partition", [r["lag_during_partition_ms"] for r in rounds])]
        width = 0.8 / max(1, len(rounds))
        for g, (_label, figures) in enumerate(groups):
            for k, f in enumerate(figures):
                x = g + (k - (len(figures) - 1) / 2) * width
                ax.bar(x, f["p99"], width * 0.9, color="#c9d7ea", edgecolor="#4a6fa5")
                ax.plot([x - width * 0.4, x + width * 0.4], [f["p50"]] * 2, color="#1f3b63", lw=2)
        caught = [r["catch_up_after_heal_s"] for r in rounds]
        ax.text(2, min(r["lag_during_partition_ms"]["p50"] for r in rounds) / 3,
                f"caught up {min(caught):.1f}–{max(caught):.1f} s\nafter the heal", ha="center", fontsize=8)
        ax.axhline(1000 * ROUND_TRIP + 100, color="darkred", ls="--", lw=1, label="goal: round trip + 100 ms")
        ax.set_xticks(range(len(groups)), [label for label, _ in groups], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("lag, ms (bar: p99, line: p50)")
        ax.set_title(f"replication-lag: {RATE:,} events/s, {1000 * ROUND_TRIP:.0f} ms round trip, "
                     f"{rounds[0]['partition_s']:.0f} s partition", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


SCENARIOS = [
    Scenario(
        name="replication-throughput", metric="events_per_s",
        description="a Replicator copying a peer's 20,000-event backlog (quick: 2,000) into a fresh location, beside "
                    "a by-slices catch-up of the peer plus one batched append per persistence id",
        setup=_setup, teardown=_teardown,
        contenders={"ours": replicated, "local_reference": local_reference},
    ),
    Scenario(
        name="replication-lag", metric="lag_p99_ms", lower_is_better=True,
        description="1,000 events/s written at a peer, read through a proxy adding a 20 ms round trip: the lag "
                    "p99 until each arrives in a Replicator's local replica, beside a live by-slices read of "
                    "the peer through the same proxy; ours then cuts the peer off for 30 s (quick: 3 s), heals, "
                    "and records the lag during the partition and the catch-up time",
        setup=_lag_setup, teardown=_lag_teardown, chart=lag_chart,
        contenders={"ours": lag_ours, "by_slices_live": lag_by_slices_live},
    ),
]
