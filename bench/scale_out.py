"""scale-out (``scale-out-append``, ``scale-out-catchup``; ``python -m bench scale-out`` runs both): a journal
sharded over 1, 2 and 4 databases (docs/sharding.md), each database on a private embedded server of its own
("N servers") or all N on one ("N databases, 1 server"), so the report separates more servers from more
databases.

* append: W = 8 writer threads per database (8, 16, 32), one ``ShardedJournal`` per layout (kept open across
  rounds, pools of 34 per database), 1 event per transaction after an expected sequence number; each writer
  cycles over 4 persistence ids, one in each quarter of the slices (so in every database), and all writers'
  ids together cover the slices evenly. References: one
  database with 8 writers, and with as many writers as the 4 databases (so more writers alone is not taken for
  scaling);
* catch-up: ``current_events_by_slices`` of each database's range in parallel, one thread per range (one
  process), over a journal pre-filled by binary COPY with the same events whatever the number of databases.
  References: one database read as one range, and as 4 ranges by 4 threads.

CPU per event, every round: the client's ``time.process_time()`` and each private server's CPU (its
postmaster's own, its live and exited children's, from ``/proc``, bench.cpu.server_cpu) in µs per event, in
the JSON's extra, with the cores each side kept busy. All servers share this machine's cores, so the rates
are bounded by them; the notes turn the measured CPU per event into what N machines would give.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from pgjournal import slice_for_persistence_id, slice_ranges
from pgjournal.server.embedded import EmbeddedServer
from pgjournal.shards import ShardedJournal, ShardSettings, migrate_all

from .append import EVENT, _cpu_threads
from .by_slices import COLUMNS, PAYLOAD, TYPES
from .cpu import CpuPerOp, measure_servers
from .harness import Context, Scenario
from .servers import database, postmaster, private_servers

SERVERS = 4
WRITERS_PER_DATABASE = 8
PIDS_PER_WRITER = 4
ENTITY = "Cart"
#: Contender → (databases, servers): "ours" is the widest layout, the references one database.
PLACEMENTS = {"ours": (4, 4), "ours_2_servers": (2, 2), "ours_4_databases_1_server": (4, 1),
              "ours_2_databases_1_server": (2, 1), "one_database": (1, 1)}


@dataclass
class Cluster:
    servers: list[EmbeddedServer]
    #: Contender's placement → its shard settings (its own databases, migrated and recorded).
    shards: dict[str, ShardSettings]
    postmasters: list[int]
    rows: int = 0
    rates: dict[str, list[float]] = field(default_factory=dict)
    journals: dict[str, ShardedJournal] = field(default_factory=dict)

    def journal(self, placement: str, **settings: Any) -> ShardedJournal:
        """The placement's journal, opened by its first round and kept (its pools stay warm) until teardown."""
        if placement not in self.journals:
            self.journals[placement] = ShardedJournal.open(self.shards[placement], **settings)
        return self.journals[placement]


def _setup(ctx: Context, *, load: bool) -> Cluster:
    """Every placement's databases, migrated and recorded, on the run's private servers (started by the first
    scale-out scenario of the run, stopped and deleted when the run ends); with ``load``, pre-filled."""
    servers = ctx.shared.get("scale-out servers", lambda: private_servers(SERVERS))
    tag = uuid.uuid4().hex[:8]
    wanted = [(name, i, i if on == count else 0) for name, (count, on) in PLACEMENTS.items() for i in range(count)]

    def make(server: int) -> dict[tuple[str, int], str]:
        return {(name, i): database(servers[server], f"scaleout_{tag}_{name}_{i}") for name, i, on in wanted
                if on == server}

    made: dict[tuple[str, int], str] = {}
    with ThreadPoolExecutor(SERVERS) as pool:  # one thread per server: its databases one after the other
        for part in pool.map(make, range(SERVERS)):
            made.update(part)
    # Nothing is dropped afterwards: DROP DATABASE waits for a checkpoint (seconds each on a busy disk); the
    # servers and all their databases go together when the run ends.
    cluster = Cluster(servers, {}, [postmaster(s) for s in servers])
    for name, (count, _on) in PLACEMENTS.items():
        cluster.shards[name] = ShardSettings.of([made[(name, i)] for i in range(count)])
        migrate_all(cluster.shards[name])
    if load:
        cluster.rows = 20_000 if ctx.quick else 200_000
        _load(cluster, cluster.rows)
    ctx.note(f"{SERVERS} private embedded servers (PostgreSQL {servers[0].status().version}), "
             f"{len(wanted)} databases")
    return cluster


def _teardown(ctx: Context, cluster: Cluster) -> None:
    for journal in cluster.journals.values():
        journal.close()
    _read_cpu(ctx, cluster)


# -- append --------------------------------------------------------------------------------------------------


def _spread_pids(writers: int) -> list[list[str]]:
    """``PIDS_PER_WRITER`` persistence ids per writer, all together one in each of ``writers * PIDS_PER_WRITER``
    equal slice buckets, dealt round-robin so each writer's ids span the slices (hence every database)."""
    buckets = writers * PIDS_PER_WRITER
    found: list[str | None] = [None] * buckets
    tag, n = uuid.uuid4().hex[:8], 0
    while None in found:
        pid = f"Bench|{tag}-{n}"
        n += 1
        bucket = slice_for_persistence_id(pid) * buckets // 1024
        if found[bucket] is None:
            found[bucket] = pid
    return [[p for p in found[w::writers] if p is not None] for w in range(writers)]


def append_rate(placement: str, writers_per_database: int = WRITERS_PER_DATABASE, *,
                writers: int | None = None, label: str | None = None) -> Callable[[Context, Cluster], float]:
    """Events/s of the placement's journal with ``writers`` threads (default: ``writers_per_database`` per
    database); the CPU split of the round is kept in the extra."""

    def measure(ctx: Context, cluster: Cluster) -> float:
        shards = cluster.shards[placement]
        count = writers or writers_per_database * shards.count
        per_writer = (800 if ctx.quick else 16_000) // count
        pids = _spread_pids(count)
        # every database's pool can serve every writer at once (the widest count of writers, plus 2); pools grow
        # only to the writers' concurrency, so all layouts' pools on the first server stay under its 300 connections
        journal = cluster.journal(placement, pool_max_size=WRITERS_PER_DATABASE * SERVERS + 2)

        def prepare(w: int) -> list[int]:
            for pid in pids[w]:  # the pools grow to the writers' concurrency in every database before the clock
                journal.append(pid, [EVENT], expected_seq_nr=0)
            return [1] * len(pids[w])

        def work(w: int, seqs: list[int]) -> None:
            mine = pids[w]
            for i in range(per_writer):
                k = i % len(mine)
                journal.append(mine[k], [EVENT], expected_seq_nr=seqs[k])
                seqs[k] += 1

        result = measure_servers(cluster.postmasters, per_writer * count,
                                 _cpu_threads(count, prepare, work, lambda _s: None))
        return _record(ctx, cluster, label or placement, result, per_writer * count)

    return measure


# -- catch-up ------------------------------------------------------------------------------------------------


def _load(cluster: Cluster, rows: int) -> None:
    """The same ``rows`` events (``rows // 100`` persistence ids, in time order) into every placement's
    databases, each row into the database of its slice, by binary COPY."""
    pids = max(100, rows // 100)
    names = [f"{ENTITY}|{i}" for i in range(pids)]
    slices = [slice_for_persistence_id(p) for p in names]
    start = datetime.now(UTC) - timedelta(hours=2)
    seq = [0] * pids
    table = []
    for n in range(rows):
        i = n % pids
        seq[i] += 1
        table.append((slices[i], ENTITY, names[i], seq[i], start + timedelta(microseconds=5 * n), "bench", 31, "",
                      PAYLOAD))
    for shards in cluster.shards.values():
        for index, dsn in enumerate(shards.dsns):
            lo, hi = shards.ranges[index]
            with psycopg.connect(dsn) as conn:
                with conn.cursor().copy(f"COPY event_journal ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(TYPES)
                    for row in table:
                        if lo <= row[0] <= hi:
                            copy.write_row(row)
                conn.commit()
            with psycopg.connect(dsn, autocommit=True) as conn:  # hint bits and statistics now, not in round 1
                conn.execute("VACUUM (ANALYZE) event_journal")


def catchup_rate(placement: str, ranges: int | None = None, *, label: str | None = None
                 ) -> Callable[[Context, Cluster], float]:
    """Rows/s of reading the whole pre-filled journal, one thread per database range (or per one of
    ``ranges`` equal ranges, all in one database)."""

    def measure(ctx: Context, cluster: Cluster) -> float:
        shards = cluster.shards[placement]
        parts = list(shards.ranges) if ranges is None else slice_ranges(ranges)
        counts = [0] * len(parts)
        journal = cluster.journal(placement, pool_max_size=SERVERS + 1, notify=False)

        def prepare(i: int) -> tuple[int, int]:
            lo, hi = parts[i]
            with journal.journal_for_slices(lo, hi).connection() as conn:
                conn.execute("SELECT 1")  # the pool's connection is open before the clock starts
            return lo, hi

        def work(i: int, part: tuple[int, int]) -> None:
            counts[i] = sum(1 for _ in journal.query.current_events_by_slices(ENTITY, *part))

        result = measure_servers(cluster.postmasters, cluster.rows,
                                 _cpu_threads(len(parts), prepare, work, lambda _s: None))
        assert sum(counts) == cluster.rows, (counts, cluster.rows)
        return _record(ctx, cluster, label or placement, result, cluster.rows)

    return measure


# -- figures -------------------------------------------------------------------------------------------------


def _record(ctx: Context, cluster: Cluster, name: str, result: CpuPerOp, events: int) -> float:
    """Keep the round's CPU split (client, all servers, the busiest server, cores busy) in the extra."""
    rate = events / result.wall_s
    cpu = ctx.extra.setdefault("cpu_us_per_event", {}).setdefault(
        name, {"client": [], "servers": [], "busiest_server": [], "client_cores": [], "server_cores": []})
    cpu["client"].append(round(result.client_us, 1))
    cpu["servers"].append(round(result.server_us, 1))
    cpu["busiest_server"].append(round(max(result.servers_us.values(), default=0.0), 1))
    cpu["client_cores"].append(round(result.client_us * events / 1e6 / result.wall_s, 2))
    cpu["server_cores"].append(round(result.server_us * events / 1e6 / result.wall_s, 2))
    cluster.rates.setdefault(name, []).append(rate)
    return rate


def _read_cpu(ctx: Context, cluster: Cluster) -> None:
    """Medians of the CPU split, the speed-ups over one database, and what N machines would give."""
    cpu = ctx.extra.get("cpu_us_per_event", {})
    if "ours" not in cpu:
        return
    med = {name: {k: statistics.median(v) for k, v in split.items()} for name, split in cpu.items()}
    base = statistics.median(cluster.rates["one_database"]) if "one_database" in cluster.rates else None
    ctx.extra["cpu_us_per_event_median"] = med
    ctx.extra["rates"] = {name: [round(r, 1) for r in rates] for name, rates in cluster.rates.items()}
    if base:
        ctx.extra["speedup_vs_one_database"] = {name: round(statistics.median(r) / base, 2)
                                                for name, r in cluster.rates.items()}
    for name, m in med.items():
        ctx.note(f"{name}: client {m['client']:.0f} µs + servers {m['servers']:.0f} µs per event "
                 f"(busiest server {m['busiest_server']:.0f}); cores busy: client {m['client_cores']:.2f}, "
                 f"servers {m['server_cores']:.2f}")
    # On separate machines the servers' work divides among them while the client's does not: one client
    # process runs its Python under one GIL (about one core), so its ceiling is 1e6 / client µs per event.
    widest = med["ours"]
    here = 2e6 / (widest["client"] + widest["servers"])
    client = 1e6 / widest["client"]
    servers = {n: 2e6 * n / widest["servers"] for n in (1, 2, 4, 8)}
    ctx.extra["projection_events_per_s"] = {
        "this_machine_cpu_bound": round(here), "one_client_process": round(client),
        "server_machines_2_cores": {n: round(v) for n, v in servers.items()}}
    crossing = widest["servers"] / (2 * widest["client"])  # server machines whose cores match one client's core
    moves = (f"the client is the bottleneck from {crossing:.1f} server machines on" if crossing >= 1 else
             "the client process is the bottleneck already with one server machine")
    ctx.note(f"CPU bound here (2 cores for client and servers) at the widest layout's CPU per event: {here:,.0f}/s; "
             "on separate 2-core server machines the servers allow "
             + ", ".join(f"{n}: {v:,.0f}/s" for n, v in servers.items())
             + f"; one client process (one GIL, ~1 core) allows {client:,.0f}/s: {moves}, and beyond it takes more "
             "client processes (each on its own core)")


def plot(summaries: list[dict[str, Any]], path: str | Path) -> None:
    """A row per scale-out summary (its JSON, so a saved line can be drawn again): the rate by number of
    databases, on as many servers and on one (whiskers: min-max of the rounds; the references at their own
    places), and the CPU per event split into client and servers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(summaries), 2, figsize=(11, 4 * len(summaries)), squeeze=False)
    for (left, right), summary in zip(axes, summaries, strict=True):
        rates, cpu = summary["extra"]["rates"], summary["extra"]["cpu_us_per_event_median"]
        unit = "events/s" if summary["metric"] == "events_per_s" else "rows/s"
        for line, names, style in (("N servers, 1 database each", ("one_database", "ours_2_servers", "ours"), "o-"),
                                   ("N databases on 1 server", ("one_database", "ours_2_databases_1_server",
                                                                "ours_4_databases_1_server"), "s--")):
            medians = [statistics.median(rates[n]) for n in names]
            spread = [[m - min(rates[n]) for m, n in zip(medians, names, strict=True)],
                      [max(rates[n]) - m for m, n in zip(medians, names, strict=True)]]
            left.errorbar([1, 2, 4], medians, yerr=spread, fmt=style, capsize=4, label=line)
        for name in rates:
            if name.startswith("one_database_"):
                left.errorbar([4], [statistics.median(rates[name])], yerr=[[statistics.median(rates[name])
                              - min(rates[name])], [max(rates[name]) - statistics.median(rates[name])]],
                              fmt="x", color="gray", capsize=4, label=f"{name.replace('_', ' ')} (reference)")
        left.set_xscale("log", base=2)
        left.set_xticks([1, 2, 4], ["1", "2", "4"])
        left.set_xlabel("databases")
        left.set_ylabel(unit)
        left.set_ylim(bottom=0)
        left.set_title(f"{summary['scenario']} (every server on the same 2 cores)", fontsize=10)
        left.grid(alpha=0.3)
        left.legend(fontsize=7)
        names = list(cpu)
        client = [cpu[n]["client"] for n in names]
        right.bar(names, client, color="tab:blue", label="client (this process)")
        right.bar(names, [cpu[n]["servers"] for n in names], bottom=client, color="tab:orange",
                  label="servers (every process)")
        right.set_ylabel("CPU µs per event (median)")
        right.set_title("CPU per event: client and servers", fontsize=10)
        right.tick_params(axis="x", rotation=25, labelsize=7)
        right.set_ylim(top=1.25 * max(c["client"] + c["servers"] for c in cpu.values()))
        right.legend(fontsize=7, loc="upper left")
    calibration = summaries[0].get("calibration") or {}
    if calibration:
        fig.text(0.01, 0.005, "machine: " + ", ".join(f"{k} {v:,.1f}" for k, v in calibration.items()), fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _scenarios() -> list[Scenario]:
    return [
        Scenario(
            name="scale-out-append", metric="events_per_s",
            description="16,000 appends (quick: 800), 1 per transaction, 8 writer threads per database, over 4 "
                        "databases on 4 private servers (ours), 2 servers, 4 or 2 databases on 1 server; "
                        "references: 1 database with 8 and with 32 writers; CPU per event in the extra",
            setup=lambda ctx: _setup(ctx, load=False), teardown=_teardown, chart=plot,
            contenders={
                "ours": append_rate("ours"),
                "ours_2_servers": append_rate("ours_2_servers"),
                "ours_4_databases_1_server": append_rate("ours_4_databases_1_server"),
                "ours_2_databases_1_server": append_rate("ours_2_databases_1_server"),
                "one_database": append_rate("one_database"),
                "one_database_32_writers": append_rate("one_database", writers=32, label="one_database_32_writers"),
            },
        ),
        Scenario(
            name="scale-out-catchup", metric="rows_per_s",
            description="catch-up of 200,000 events (quick: 20,000) by each database's range in parallel (one "
                        "thread each) over 4 databases on 4 private servers (ours), 2 servers, 4 or 2 databases on "
                        "1 server; references: 1 database as 1 range and as 4 ranges; CPU per row in the extra",
            setup=lambda ctx: _setup(ctx, load=True), teardown=_teardown, chart=plot,
            contenders={
                "ours": catchup_rate("ours"),
                "ours_2_servers": catchup_rate("ours_2_servers"),
                "ours_4_databases_1_server": catchup_rate("ours_4_databases_1_server"),
                "ours_2_databases_1_server": catchup_rate("ours_2_databases_1_server"),
                "one_database": catchup_rate("one_database"),
                "one_database_4_ranges": catchup_rate("one_database", 4, label="one_database_4_ranges"),
            },
        ),
    ]


SCENARIOS = _scenarios()
