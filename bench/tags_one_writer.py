"""Where the default tag path's time goes at one writer: ``python -m bench.tags_one_writer [--n N]``.

Three probes, each on a scratch database of the bench server, rounds interleaved, one writer:

``statement``: the append's own INSERT (the statement the journal sends for one event after a known predecessor)
run N times on one connection, untagged, with 1 tag, and with 1 tag after the partial index
``event_journal_tagged_idx`` is dropped: server CPU (the backend's ``schedstat``), client CPU and wall time per
statement.

``journal``: N appends through ``Journal.append`` at one writer, untagged and with 1 tag (the default path, the
batched tag writer, flushed at the end as the bench does), and the floor (untagged appends copied by the bench's
``_FloorTagWriter``): per append the client CPU of the appending thread (``time.thread_time``), of the whole
process, the server CPU of each backend (the pool's, the tag writer's or the floor's connection) and the wall time.

``profile``: cProfile of the appending thread, tagged and untagged, the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.server.dsn import resolve_dsn
from pgjournal.store.events import insert_sql, text_array
from pgjournal.store.schema import TAGGED_INDEX

from .append import EVENT, PAYLOAD
from .cpu import _run_seconds, _stat, backend_cpu
from .harness import scratch_database
from .tags import _FloorTagWriter


def _backend_seconds(pid: int) -> float:
    fields = _stat(str(pid))
    assert fields is not None
    return _run_seconds(str(pid), fields)


def statement_probe(server_dsn: str, n: int, rounds: int) -> dict[str, Any]:
    sql_untagged = insert_sql("event_journal", single=True, after="known", tags=False, meta=False)
    sql_tagged = insert_sql("event_journal", single=True, after="known", tags=True, meta=False)
    out: dict[str, list[dict[str, float]]] = {}
    with scratch_database(server_dsn) as dsn, scratch_database(server_dsn) as no_index_dsn:
        with psycopg.connect(no_index_dsn, autocommit=True) as conn:
            conn.execute(f"DROP INDEX {TAGGED_INDEX.name}")
        variants = {"untagged": (dsn, sql_untagged, False), "tagged": (dsn, sql_tagged, True),
                    "tagged_no_index": (no_index_dsn, sql_tagged, True)}
        for _ in range(rounds):
            for name, (target, sql, tagged) in variants.items():
                out.setdefault(name, []).append(_statement_round(target, sql, tagged, n))
    return {name: _medians(values) for name, values in out.items()} | {"rounds": out}


def _statement_round(dsn: str, sql: str, tagged: bool, n: int) -> dict[str, float]:
    pid = f"Bench|{uuid.uuid4().hex}"
    params: dict[str, Any] = {"slice": 1, "entity_type": "Bench", "pid": pid, "writer": "probe", "ser_id": 31,
                              "manifest": "", "payload": PAYLOAD, "expected": 0, "prev_ts": None}
    if tagged:
        params["tags"] = text_array(("bench",))
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        for i in range(20):  # prepared, warm
            params["expected"] = i
            params["prev_ts"] = cur.execute(sql, params, prepare=True, binary=True).fetchall()[0][1]
        backend = conn.info.backend_pid
        server0, client0, wall0 = _backend_seconds(backend), time.process_time(), time.perf_counter()
        for i in range(20, 20 + n):
            params["expected"] = i
            params["prev_ts"] = cur.execute(sql, params, prepare=True, binary=True).fetchall()[0][1]
        wall, client = time.perf_counter() - wall0, time.process_time() - client0
        server = _backend_seconds(backend) - server0
    return {"server_us": server * 1e6 / n, "client_us": client * 1e6 / n, "wall_us": wall * 1e6 / n}


def _medians(values: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(v[key] for v in values), 1) for key in values[0]}


def journal_probe(server_dsn: str, n: int, rounds: int) -> dict[str, Any]:
    out: dict[str, list[dict[str, float]]] = {}
    with scratch_database(server_dsn) as dsn:
        journal = Journal.open(dsn, pool_max_size=12)
        try:
            contenders: dict[str, Callable[[], dict[str, float]]] = {
                "default_1_tag": lambda: _journal_round(dsn, journal, n, ("bench",)),
                "untagged": lambda: _journal_round(dsn, journal, n, ()),
                "floor": lambda: _journal_round(dsn, journal, n, (), floor=True),
            }
            for _ in range(rounds):
                for name, contender in contenders.items():
                    out.setdefault(name, []).append(contender())
        finally:
            journal.close()
    return {name: _medians(values) for name, values in out.items()} | {"rounds": out}


def _journal_round(dsn: str, journal: Journal, n: int, tags: tuple[str, ...], *, floor: bool = False
                   ) -> dict[str, float]:
    pid = f"Bench|{uuid.uuid4().hex}"
    for i in range(20):
        journal.append(pid, [EVENT], expected_seq_nr=i, tags=tags)
    writer = journal.tag_writer
    if writer is not None:
        writer.flush()
    copier = _FloorTagWriter(dsn) if floor else None
    side_backend = copier._conn.info.backend_pid if copier is not None else (
        writer._conn.info.backend_pid if writer is not None and writer._conn is not None and tags else None)
    before = backend_cpu(dsn)
    thread0, process0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    if copier is not None:
        copier.append(journal, pid, range(20, 20 + n))
    else:
        for i in range(20, 20 + n):
            journal.append(pid, [EVENT], expected_seq_nr=i, tags=tags)
    thread = time.thread_time() - thread0
    if copier is not None:
        copier.finish()
    elif writer is not None and tags:
        writer.flush()
    wall, process = time.perf_counter() - wall0, time.process_time() - process0
    after = backend_cpu(dsn)
    if copier is not None:
        copier.close()
    used = {pid_: cpu - before.get(pid_, 0.0) for pid_, cpu in after.items()}
    side = used.pop(str(side_backend), 0.0) if side_backend is not None else 0.0
    return {"append_thread_client_us": thread * 1e6 / n, "process_client_us": process * 1e6 / n,
            "other_threads_client_us": (process - thread) * 1e6 / n,
            "append_backends_server_us": sum(used.values()) * 1e6 / n, "side_backend_server_us": side * 1e6 / n,
            "wall_us": wall * 1e6 / n, "events_per_s": n / wall}


def profile_probe(server_dsn: str, n: int) -> dict[str, str]:
    out = {}
    with scratch_database(server_dsn) as dsn:
        journal = Journal.open(dsn, pool_max_size=12)
        try:
            for name, tags in (("tagged", ("bench",)), ("untagged", ())):
                pid = f"Bench|{uuid.uuid4().hex}"
                for i in range(20):
                    journal.append(pid, [EVENT], expected_seq_nr=i, tags=tags)
                profiler = cProfile.Profile(time.thread_time)
                profiler.enable()
                for i in range(20, 20 + n):
                    journal.append(pid, [EVENT], expected_seq_nr=i, tags=tags)
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                out[name] = text.getvalue()
        finally:
            journal.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["statement", "journal", "profile"])
    args = parser.parse_args()
    server_dsn = resolve_dsn(None)
    result: dict[str, Any] = {}
    if args.only in (None, "statement"):
        result["statement"] = statement_probe(server_dsn, args.n, args.rounds)
    if args.only in (None, "journal"):
        result["journal"] = journal_probe(server_dsn, args.n, args.rounds)
    if args.only == "profile":
        for name, text in profile_probe(server_dsn, args.n).items():
            print(f"== {name}\n{text}")
        return
    for probe, figures in result.items():
        for name, values in figures.items():
            if name != "rounds":
                print(probe, name, values)
    print(json.dumps(result))


if __name__ == "__main__":
    threading.current_thread().name = "probe"
    main()
