"""scale: append and catch-up at 1, 2, 4, 8, 16 writers/consumers over journals of 100k and 1M events (5M
with ``--scale-5m``), and a PNG of the curves.

Per journal size, on a fresh database loaded by binary COPY (bench.by_slices.load: 5 entity types, 10 events
per persistence id per 100k), two curves:

* append: events/s of N writer threads (one Journal, one entity each, 1 event per transaction, after an
  expected sequence number) appending on top of the loaded journal;
* catch-up: rows/s of ``current_events_by_slices`` of one entity type (a fifth of the journal) split into N
  slice ranges, each read by its own process.

The reference is the same measurement at the smallest size and at one writer/consumer: ``cost_ratio`` is
the time per event relative to that point, so a cost growing faster than the work shows as a ratio above
what the CPUs explain (2 cores here: N > 2 cannot go faster, only stay flat).
"""

from __future__ import annotations

import uuid
from typing import Any

from pgjournal import Journal

from .append import EVENT, _threads
from .by_slices import catchup_rate, load
from .harness import scratch_database

COUNTS = (1, 2, 4, 8, 16)
SIZES = (100_000, 1_000_000)
BIG = 5_000_000


def _append_rate(dsn: str, writers: int, total: int) -> float:
    with Journal.open(dsn, pool_max_size=max(2, writers + 2)) as journal:
        def work(_w: int, n: int) -> None:
            pid = f"Scale|{uuid.uuid4().hex}"
            for i in range(n):
                journal.append(pid, [EVENT], expected_seq_nr=i)

        work(0, 20)  # warm the pool and the prepared statements
        return (total // writers * writers) / _threads(writers, total // writers, work)


def run(server_dsn: str, *, quick: bool, big: bool, progress: Any = lambda _m: None) -> dict[str, Any]:
    """The curves: ``{"append": {size: {n: events/s}}, "catchup": {size: {n: rows/s}}}`` plus cost ratios."""
    sizes = (10_000, 100_000) if quick else (*SIZES, *((BIG,) if big else ()))
    appends = 1_000 if quick else 4_000
    out: dict[str, Any] = {"append": {}, "catchup": {}, "sizes": list(sizes), "counts": list(COUNTS),
                           "append_events_per_point": appends}
    for size in sizes:
        with scratch_database(server_dsn) as dsn:
            progress(f"scale: loading {size:,} events")
            load(dsn, size, max(1_000, size // 100))
            rows = size // 5  # one entity type of five
            out["catchup"][size] = {}
            for n in COUNTS:
                progress(f"scale: {size:,} events, catch-up with {n} consumer(s)")
                out["catchup"][size][n] = round(catchup_rate(dsn, n, rows), 1)
            out["append"][size] = {}
            for n in COUNTS:
                progress(f"scale: {size:,} events, append with {n} writer(s)")
                out["append"][size][n] = round(_append_rate(dsn, n, appends), 1)
    for kind in ("append", "catchup"):
        base = out[kind][sizes[0]][1]
        out[f"{kind}_cost_ratio"] = {size: {n: round(base / rate, 2) for n, rate in curve.items()}
                                     for size, curve in out[kind].items()}
    return out


def plot(curves: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind, unit in ((axes[0], "append", "events/s"), (axes[1], "catchup", "rows/s")):
        for size, curve in curves[kind].items():
            ax.plot(list(curve), list(curve.values()), marker="o", label=f"{int(size):,} events")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(COUNTS), [str(c) for c in COUNTS])
        ax.set_xlabel("writers" if kind == "append" else "consumers (slice ranges, 1 process each)")
        ax.set_ylabel(unit)
        ax.set_title("append, 1 event/txn" if kind == "append" else "catch-up of one entity type (1/5)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
