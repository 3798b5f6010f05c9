"""scale-out (``scale-out-append``, ``scale-out-catchup``; ``python -m bench scale-out`` runs both): a journal
sharded over 1, 2 and 4 databases (docs/sharding.md), each database on a private embedded server of its own
("N servers") or all N on one ("N databases, 1 server"), so the report separates more servers from more
databases.

* append: W = 8 writer threads per database (8, 16, 32), one ``ShardedJournal`` (pool W + 2 per database),
  1 event per transaction after an expected sequence number; each writer cycles over 8 persistence ids and the
  writers' ids together cover all slices evenly, so every writer writes to every database. References: one
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
PIDS_PER_WRITER = 8
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
    close: Callable[[], None] = lambda: None
    rates: dict[str, list[float]] = field(default_factory=dict)


def _setup(ctx: Context, *, load: bool) -> Cluster:
    servers_cm = private_servers(SERVERS)
    servers = servers_cm.__enter__()
    try:
        wanted = [(name, i, i if on == count else 0) for name, (count, on) in PLACEMENTS.items() for i in range(count)]

        def make(server: int) -> dict[tuple[str, int], str]:
            return {(name, i): database(servers[server], f"scaleout_{name}_{i}") for name, i, on in wanted
                    if on == server}

        made: dict[tuple[str, int], str] = {}
        with ThreadPoolExecutor(SERVERS) as pool:  # one thread per server: its databases one after the other
            for part in pool.map(make, range(SERVERS)):
                made.update(part)
        shards: dict[str, ShardSettings] = {}
        for name, (count, _on) in PLACEMENTS.items():
            shards[name] = ShardSettings.of([made[(name, i)] for i in range(count)])
            migrate_all(shards[name])
        cluster = Cluster(servers, shards, [postmaster(s) for s in servers],
                          close=lambda: servers_cm.__exit__(None, None, None))
        if load:
            cluster.rows = 20_000 if ctx.quick else 200_000
            _load(cluster, cluster.rows)
        ctx.note(f"{SERVERS} private embedded servers (PostgreSQL {servers[0].status().version}), "
                 f"{sum(s.count for s in shards.values())} databases")
        return cluster
    except BaseException:
        servers_cm.__exit__(None, None, None)
        raise


def _teardown(ctx: Context, cluster: Cluster) -> None:
    try:
        _read_cpu(ctx, cluster)
    finally:
        cluster.close()


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
        per_writer = (1_600 if ctx.quick else 16_000) // count
        pids = _spread_pids(count)
        with ShardedJournal.open(shards, pool_max_size=count + 2) as journal:
            def prepare(w: int) -> list[int]:
                for pid in pids[w]:  # every writer's connection and prepared statements, in every database
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
                conn.execute("ANALYZE event_journal")
                conn.commit()


def catchup_rate(placement: str, ranges: int | None = None, *, label: str | None = None
                 ) -> Callable[[Context, Cluster], float]:
    """Rows/s of reading the whole pre-filled journal, one thread per database range (or per one of
    ``ranges`` equal ranges, all in one database)."""

    def measure(ctx: Context, cluster: Cluster) -> float:
        shards = cluster.shards[placement]
        parts = list(shards.ranges) if ranges is None else slice_ranges(ranges)
        counts = [0] * len(parts)
        with ShardedJournal.open(shards, pool_max_size=len(parts) + 1, notify=False) as journal:
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


def _scenarios() -> list[Scenario]:
    return [
        Scenario(
            name="scale-out-append", metric="events_per_s",
            description="16,000 appends (quick: 1,600), 1 per transaction, 8 writer threads per database, over 4 "
                        "databases on 4 private servers (ours), 2 servers, 4 or 2 databases on 1 server; "
                        "references: 1 database with 8 and with 32 writers; CPU per event in the extra",
            setup=lambda ctx: _setup(ctx, load=False), teardown=_teardown,
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
            setup=lambda ctx: _setup(ctx, load=True), teardown=_teardown,
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
