"""CPU per operation, client and server, for the write-path scenarios (``append-cpu``, ``tags-append-cpu``).

On 2 cores client and server share the CPU, so CPU time per append *is* throughput, and unlike a wall-clock
rate it is hardly moved by other work on a shared machine. The client's share is this process's CPU time
(every thread: writers, the pool's workers, the notification sender); the server's is the CPU time of the
backends serving the benchmark's database, read from ``/proc/<pid>/stat`` (the server runs on this machine:
the embedded one, or a local one). Backends are found by their process title (``postgres: user db ...``), so
connections must stay open until the second reading. ``scale-out`` reads whole servers of its own instead
(:func:`server_cpu`: a postmaster and every child, exited ones included).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg.conninfo

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _title(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat(pid: str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (index 0 is field 3 of the full line)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_seconds(pid: str) -> float | None:
    fields = _stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of the full line)


def backend_cpu(dsn: str) -> dict[str, float]:
    """CPU seconds so far of each backend serving ``dsn``'s database (empty when the server is elsewhere)."""
    dbname = psycopg.conninfo.conninfo_to_dict(dsn).get("dbname")
    needle = f" {dbname} "
    out: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        title = _title(entry)
        if title.startswith("postgres: ") and needle in title:
            cpu = _cpu_seconds(entry)
            if cpu is not None:
                out[entry] = cpu
    return out


def server_cpu(postmasters: list[int]) -> dict[int, float]:
    """CPU seconds so far of each server, by its postmaster's pid: the postmaster's own, its reaped children's
    (cutime, cstime: a backend that exited meanwhile still counts) and its live children's (backends, the
    WAL writer, checkpointer, autovacuum). A difference of two readings is all the server did in between."""
    totals: dict[int, float] = {}
    for pm in postmasters:
        fields = _stat(str(pm))
        if fields is not None:
            totals[pm] = _run_seconds(str(pm), fields) + (int(fields[13]) + int(fields[14])) / _TICK
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None and int(fields[1]) in totals:  # field 4: the parent's pid
                totals[int(fields[1])] += _run_seconds(entry, fields)
    return totals


def _run_seconds(pid: str, fields: list[str]) -> float:
    """A process's CPU time so far: from ``schedstat`` (nanoseconds) when the kernel keeps it, else utime +
    stime (clock ticks: 10 ms steps are coarse beside a backend's share of a few thousand events)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass
class CpuPerOp:
    client_us: float
    server_us: float
    wall_s: float
    #: Server CPU µs per operation by what was read (:func:`measure_servers`: each postmaster's pid).
    servers_us: dict[Any, float] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        return self.client_us + self.server_us


Run = Callable[[Callable[[], None], Callable[[], None]], None]


def measure(dsn: str, ops: int, run: Run) -> CpuPerOp:
    """CPU µs per operation of ``run(start, stop)``, which does ``ops`` operations between its calls of
    ``start()`` (every connection it uses already open) and ``stop()`` (none closed yet): a backend that starts
    later counts with its connection set-up, one that exits earlier not at all."""
    return _measure(lambda: backend_cpu(dsn), ops, run)


def measure_servers(postmasters: list[int], ops: int, run: Run) -> CpuPerOp:
    """As :func:`measure`, with the server side read as whole servers (:func:`server_cpu`): every process of
    each, exited backends included, split by postmaster in ``servers_us``."""
    return _measure(lambda: server_cpu(postmasters), ops, run)


def _measure(read: Callable[[], Mapping[Any, float]], ops: int, run: Run) -> CpuPerOp:
    marks: dict[str, float] = {}
    before: dict[Any, float] = {}
    after: dict[Any, float] = {}

    def start() -> None:
        before.update(read())
        marks["client"] = time.process_time()
        marks["wall"] = time.perf_counter()

    def stop() -> None:
        marks["wall"] = time.perf_counter() - marks["wall"]
        marks["client"] = time.process_time() - marks["client"]
        after.update(read())

    run(start, stop)
    used = {key: cpu - before.get(key, 0.0) for key, cpu in after.items()}
    return CpuPerOp(marks["client"] * 1e6 / ops, sum(used.values()) * 1e6 / ops, marks["wall"],
                    {key: cpu * 1e6 / ops for key, cpu in used.items()})
