"""CPU per operation, client and server, for the write-path scenarios (``append-cpu``, ``tags-append-cpu``).

On 2 cores client and server share the CPU, so CPU time per append *is* throughput, and unlike a wall-clock
rate it is hardly moved by other work on a shared machine. The client's share is this process's CPU time
(every thread: writers, the pool's workers, the notification sender); the server's is the CPU time of the
backends serving the benchmark's database, read from ``/proc/<pid>/stat`` (the server runs on this machine:
the embedded one, or a local one). Backends are found by their process title (``postgres: user db ...``), so
connections must stay open until the second reading.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg.conninfo

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _title(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cpu_seconds(pid: str) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
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


@dataclass
class CpuPerOp:
    client_us: float
    server_us: float
    wall_s: float

    @property
    def total_us(self) -> float:
        return self.client_us + self.server_us


def measure(dsn: str, ops: int, run: Callable[[Callable[[], None], Callable[[], None]], None]) -> CpuPerOp:
    """CPU µs per operation of ``run(start, stop)``, which does ``ops`` operations between its calls of
    ``start()`` (every connection it uses already open) and ``stop()`` (none closed yet): a backend that starts
    later counts with its connection set-up, one that exits earlier not at all."""
    marks: dict[str, float] = {}
    before: dict[str, float] = {}
    after: dict[str, float] = {}

    def start() -> None:
        before.update(backend_cpu(dsn))
        marks["client"] = time.process_time()
        marks["wall"] = time.perf_counter()

    def stop() -> None:
        marks["wall"] = time.perf_counter() - marks["wall"]
        marks["client"] = time.process_time() - marks["client"]
        after.update(backend_cpu(dsn))

    run(start, stop)
    server = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
    return CpuPerOp(marks["client"] * 1e6 / ops, server * 1e6 / ops, marks["wall"])
